"""`loadlink engine` as a router would see it: /server_info read the way SGLang's router consumer
reads it, and the published load decoded by SGLang's own decoders."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request

import msgspec
import pytest
import zmq

from conftest import loadlink_bin
from sglang_oracle import load_publisher, load_snapshot as ls
from test_publish_interop import free_port_block


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def engine_factory():
    procs = []

    def start(*args: str) -> str:
        http = free_port_block(1)
        p = subprocess.Popen([loadlink_bin(), "engine", "--port", str(http), "--time-scale", "10", "--duration", "60", *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    r.read()
                return url
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("engine did not start")

    yield start
    for p in procs:
        p.kill()
        p.wait()


def subscribe(url: str, info: dict) -> list[zmq.Socket]:
    """What SGLang's router consumer does: dial the worker URL's host at base + rank, filtering on
    `load_topic` when advertised (the generation-A form has none: subscribe-all)."""
    kv = info["kv_events"]
    host = url.split("//")[1].rsplit(":", 1)[0]
    topic = kv.get("load_topic", "").encode()
    socks = []
    for rank in range(kv["dp_size"]):
        s = zmq.Context.instance().socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, topic)
        s.connect(f"tcp://{host}:{kv['load_endpoint_port_base'] + rank}")
        socks.append(s)
    return socks


def recv_one(s: zmq.Socket, timeout: float = 15) -> list[bytes]:
    assert s.poll(int(timeout * 1000)), "no load message"
    return s.recv_multipart()


def test_generation_b_engine_is_read_like_sglangs_router(engine_factory):
    kv = free_port_block(6)
    url = engine_factory("--dp-size", "2", "--load-wire", "loadstat", "--load-publish-endpoint", "auto",
                         "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}))
    info = get(url + "/server_info")
    d = info["kv_events"]
    # The router consumer requires both keys before it subscribes.
    assert d["load_topic"] == "load" and d["load_endpoint_port_base"] == kv + 2 and d["dp_size"] == 2
    dec = msgspec.msgpack.Decoder(load_publisher.LoadStat)
    socks = subscribe(url, info)
    post(url + "/v1/completions", {"prompt": "hello", "max_tokens": 3})
    for rank, s in enumerate(socks):
        topic, seq, payload = recv_one(s)
        assert topic == b"load" and len(seq) == 8
        stat = dec.decode(payload)
        assert stat.attn_dp_rank == rank and stat.max_total_num_tokens == 200_000 and stat.max_running_requests == 128
        s.close(0)


def test_generation_a_engine_decodes_with_sglangs_snapshot_decoder(engine_factory):
    kv = free_port_block(4)
    url = engine_factory("--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}))
    info = get(url + "/server_info")
    assert "load_topic" not in info["kv_events"] and info["kv_events"]["load_endpoint_port_base"] == kv + 1
    (s,) = subscribe(url, info)
    recv_one(s)  # joined
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "x" * 400, "max_tokens": 300}).encode())
    # Fire a long request without waiting for it, then watch the socket report it.
    threading.Thread(target=lambda: urllib.request.urlopen(req, timeout=60).read(), daemon=True).start()
    deadline, seen = time.monotonic() + 15, None
    while time.monotonic() < deadline:
        topic, seq, payload = recv_one(s)
        assert topic == b""
        snap = ls.snapshot_decoder.decode(payload)
        if snap.num_running_reqs == 1:
            seen = snap
            break
    assert seen is not None, "the running request never showed up on the load socket"
    assert seen.num_used_tokens >= 100 and seen.timestamp > 0 and seen.max_total_num_tokens == 200_000
    # /v1/loads renders what SGLang's own to_dict would for the same snapshot.
    loads = get(url + "/v1/loads")["loads"]
    assert set(loads[0]) == set(ls._CORE_KEYS) | {"memory", "queues"}
    s.close(0)


def test_engine_without_kv_config_advertises_no_load(engine_factory):
    url = engine_factory()
    assert get(url + "/server_info")["kv_events"] is None
