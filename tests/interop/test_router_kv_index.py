"""The router's KV index fed by SGLang 0.5.23's own `ZmqEventPublisher` (from the wheel).

A Python `http.server` plays the worker's `/server_info`, advertising that publisher's PUB and
replay ports the way an SGLang engine does; `loadlink route` discovers it, subscribes, and its
`/workers` and `/metrics` must show exactly the blocks SGLang's stored, removed and cleared
events leave.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import loadlink_bin
from live import get_json, http, responds, wait_until
from sglang_oracle import kv_events as kv
from test_publish_interop import free_port_block

BLOCK = 16


def server_info(pub_port: int, replay_port: int) -> dict:
    return {"version": "0.5.23", "kv_events": {
        "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": pub_port, "topic": "",
        "block_size": BLOCK, "dp_size": 1, "replay_endpoint_port_base": replay_port}}


@pytest.fixture
def front():
    """A worker front serving `/server_info` (and `/health`); yields (url, set_info)."""
    info: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            body = json.dumps(info).encode() if self.path == "/server_info" else b"ok"
            self.send_response(200 if self.path in ("/server_info", "/health") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", info.update
    finally:
        server.shutdown()


def stored(hashes: list[int], parent) -> kv.BlockStored:
    return kv.BlockStored(block_hashes=hashes, parent_block_hash=parent,
                          token_ids=list(range(BLOCK * len(hashes))), block_size=BLOCK, lora_id=None)


def metric(router: str, name: str) -> float:
    _, body, _ = http(router + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            key, value = line.rsplit(" ", 1)
            if key == name:
                return float(value)
    raise AssertionError(f"{name} not on /metrics")


def labelled(router: str, name: str, label: str) -> float:
    _, body, _ = http(router + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{label}}} not on /metrics")


def kv_view(router: str, worker: str) -> dict:
    ws = get_json(router + "/workers")["workers"]
    return next(w for w in ws if w["url"] == worker)["kv_events"]


def test_router_indexes_sglangs_publisher(procs, front):
    url, set_info = front
    base = free_port_block(2)
    pub = kv.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://*:{base}",
                               replay_endpoint=f"tcp://*:{base + 1}")
    try:
        set_info(server_info(base, base + 1))
        port = free_port_block(1)
        router = f"http://127.0.0.1:{port}"
        procs.spawn([loadlink_bin(), "route", "--worker-urls", url, "--port", str(port),
                     "--duration", "120"])
        wait_until("the router to serve", lambda: responds(router + "/health"))
        view = kv_view(router, url)
        assert view is not None and view["block_size"] == BLOCK, view
        # Empty probe batches until the router has one (live or replayed): it has joined.
        wait_until("the router to join SGLang's stream", lambda: pub.publish(
            kv.KVEventBatch(ts=0.5, events=[])) or kv_view(router, url)["last_seq"][0] is not None)

        pub.publish(kv.KVEventBatch(ts=1.0, events=[stored([11, 12, 13], None)]))
        pub.publish(kv.KVEventBatch(ts=2.0, events=[stored([14, 15], 12)]))
        pub.publish(kv.KVEventBatch(ts=3.0, events=[kv.BlockRemoved(block_hashes=[15])]))
        wait_until("4 blocks indexed", lambda: kv_view(router, url)["blocks"] == 4)
        assert metric(router, "loadlink_kv_index_blocks") == 4
        assert labelled(router, "loadlink_kv_events_total", 'type="stored"') == 2
        assert labelled(router, "loadlink_kv_events_total", 'type="removed"') == 1
        assert labelled(router, "loadlink_kv_block_events_total", 'type="stored"') == 5

        pub.publish(kv.KVEventBatch(ts=4.0, events=[kv.AllBlocksCleared()]))
        wait_until("the clear applied", lambda: kv_view(router, url)["blocks"] == 0)
        assert metric(router, "loadlink_kv_index_blocks") == 0
        assert labelled(router, "loadlink_kv_events_total", 'type="cleared"') == 1
        view = kv_view(router, url)
        assert view["needs_resync"] is False and view["resyncs"] == 0, view
        assert metric(router, "loadlink_kv_decode_errors_total") == 0
    finally:
        pub.shutdown()


def start_router(procs, url: str) -> str:
    port = free_port_block(1)
    router = f"http://127.0.0.1:{port}"
    procs.spawn([loadlink_bin(), "route", "--worker-urls", url, "--port", str(port),
                 "--duration", "120"])
    wait_until("the router to serve", lambda: responds(router + "/health"))
    return router


def publish_chain(pub, n: int) -> list[int]:
    """`n` batches, each storing one block that chains onto the previous one; their hashes."""
    hashes = [1_000 + i for i in range(n)]
    for i, h in enumerate(hashes):
        pub.publish(kv.KVEventBatch(ts=float(i + 1), events=[stored([h], hashes[i - 1] if i else None)]))
    return hashes


@pytest.mark.parametrize("buffer_steps", [1_000, 5])
def test_a_publisher_without_snapshots_is_replayed_and_the_view_says_how_much(procs, front, buffer_steps):
    """SGLang 0.5.23 has no snapshots: it reads `snapshot-v1` as a replay from an absurd seq and
    answers the bare end marker. A router that joins late must take that as "no snapshot", replay
    the buffer from seq 0, and say whether the buffer reached the publisher's first batch: with a
    buffer that holds all 40 batches the view is complete and equals what was published; with 5
    it is `no_snapshot`, holds no block whose parent it never saw, and says why."""
    url, set_info = front
    base = free_port_block(2)
    pub = kv.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://*:{base}",
                               replay_endpoint=f"tcp://*:{base + 1}", buffer_steps=buffer_steps)
    try:
        set_info(server_info(base, base + 1))
        hashes = publish_chain(pub, 40)  # all before the router exists
        router = start_router(procs, url)
        wait_until("the snapshot request answered",
                   lambda: metric(router, "loadlink_kv_snapshots_failed_total") >= 1)
        if buffer_steps >= 40:
            wait_until("the whole chain replayed", lambda: kv_view(router, url)["blocks"] == len(hashes))
            view = kv_view(router, url)
            assert view["views"] == ["complete"] and view["needs_resync"] is False, view
            assert view["not_indexed_reason"] is None, view
        else:
            wait_until("the replay applied", lambda: kv_view(router, url)["last_seq"][0] == 39)
            view = kv_view(router, url)
            assert view["views"] == ["no_snapshot"] and view["needs_resync"] is True, view
            assert "no_snapshot" in view["not_indexed_reason"], view
            # The buffer's blocks chain onto parents published before it: none is held as if
            # its prefix were cached.
            assert view["blocks"] == 0, view
        assert metric(router, "loadlink_kv_snapshots_loaded_total") == 0
        assert metric(router, "loadlink_kv_decode_errors_total") == 0
        # Live batches keep applying on top, whatever the view.
        pub.publish(kv.KVEventBatch(ts=99.0, events=[stored([7, 8], None)]))
        want = (len(hashes) if buffer_steps >= 40 else 0) + 2
        wait_until("a later live batch applied", lambda: kv_view(router, url)["blocks"] == want)
    finally:
        pub.shutdown()
