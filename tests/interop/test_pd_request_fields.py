"""`loadlink route --pd` sends PD requests that SGLang 0.5.23's own request models read with the
bootstrap fields set, the same on both legs.

Two prefill and one decode engine are played by small loopback HTTP servers: `GET /server_info`
advertises the role (`disaggregation_mode`) and a bootstrap port, and every generation request is
recorded as it arrived, then answered (JSON, or SSE when it asks to stream). One prefill engine's
port is given on the command line (`--prefill URL PORT`), the other's is discovered. Each recorded
body is then parsed with SGLang's code from the wheel (`GenerateReqInput` after
`/generate`'s JSON contract, with its batch normalisation; `CompletionRequest`;
`ChatCompletionRequest`), and what SGLang reads must be: the prefill engine's host and port, a
room in [0, 2^63), one room per prompt of a batch, and the same fields on the decode leg.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import loadlink_bin
from live import get_json, http, responds, wait_until
from test_publish_interop import free_port_block
from test_routed_rank import _wheel_scope, sglang


class Capture:
    """A PD engine's HTTP front: advertises `mode` and `bootstrap_port`, records (path, body)."""

    def __init__(self, mode: str, bootstrap_port: int | None):
        self.mode = mode
        self.received: list[tuple[str, dict]] = []
        info = {"disaggregation_mode": mode, "disaggregation_bootstrap_port": bootstrap_port}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a):
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path in ("/server_info", "/get_server_info"):
                    self._send(200, json.dumps(info).encode())
                else:
                    self._send(200, b'"ok"')

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                outer.received.append((self.path, body))
                if body.get("stream"):
                    events = [json.dumps({"text": f"{mode}-{i}"}) for i in range(2)] + ["[DONE]"]
                    payload = "".join(f"data: {e}\n\n" for e in events).encode()
                    self._send(200, payload, "text/event-stream")
                else:
                    self._send(200, json.dumps({"text": "ok", "role": mode}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet():
    engines = {"p1": Capture("prefill", 9411), "p2": Capture("prefill", 9412), "d": Capture("decode", None)}
    try:
        yield engines
    finally:
        for e in engines.values():
            e.close()


def sglang_fields(path: str, body: dict) -> tuple[object, object, object]:
    """(bootstrap_host, bootstrap_port, bootstrap_room) as SGLang 0.5.23 reads them."""
    s = sglang()
    with _wheel_scope():
        if path == "/generate":
            s.api_types.decode_GenerateRequest(body)  # the JSON contract gate; raises if refused
            obj = s.io_struct.GenerateReqInput(**body)
            obj.normalize_batch_and_arguments()
        else:
            model = {"/v1/completions": s.protocol.CompletionRequest,
                     "/v1/chat/completions": s.protocol.ChatCompletionRequest}[path]
            obj = model.model_validate(body)
        return obj.bootstrap_host, obj.bootstrap_port, obj.bootstrap_room


def prompts(path: str, body: dict) -> int | None:
    """The prompts of a batched `/generate` (None: one request)."""
    if path != "/generate":
        return None
    if isinstance(body.get("text"), list):
        return len(body["text"])
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


REQUESTS = [
    ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 2}}),
    ("/generate", {"text": ["one", "two", "three"], "sampling_params": {"max_new_tokens": 2}}),
    ("/generate", {"input_ids": [[1, 2, 3], [4, 5]], "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "stream": True}),
]


def test_sglang_reads_the_bootstrap_fields_loadlink_sends(procs, fleet):
    port = free_port_block(1)
    p1, p2, d = fleet["p1"], fleet["p2"], fleet["d"]
    procs.spawn([loadlink_bin(), "route", "--port", str(port), "--pd",
                 "--prefill", p1.url, "9511", "--prefill", p2.url, "--decode", d.url,
                 "--prefill-policy", "round_robin", "--duration", "120"])
    base = f"http://127.0.0.1:{port}"
    wait_until("the router's /health", lambda: responds(base + "/health"))
    wait_until("the router's three PD workers",
               lambda: len(get_json(base + "/workers")["workers"]) == 3)
    workers = {w["url"]: w for w in get_json(base + "/workers")["workers"]}
    assert workers[p1.url]["role"] == "prefill" and workers[p1.url]["bootstrap_port"] == 9511
    assert workers[p2.url]["bootstrap_port"] == 9412, "discovered from /server_info"
    assert workers[d.url]["role"] == "decode"

    for _ in range(2):
        for path, body in REQUESTS:
            status, raw, headers = http(base + path, body)
            assert status == 200, f"{path}: {status} {raw[:300]!r}"
            assert b"decode" in raw, f"the client gets the decode engine's answer: {raw[:200]!r}"

    port_of = {p1.url: 9511, p2.url: 9412}
    prefilled: dict[int, tuple] = {}
    for engine in (p1, p2):
        for path, body in engine.received:
            host, bport, room = sglang_fields(path, body)
            n = prompts(path, body)
            rooms = room if isinstance(room, list) else [room]
            hosts = host if isinstance(host, list) else [host]
            ports = bport if isinstance(bport, list) else [bport]
            if n is not None:
                assert len(rooms) == n and len(set(rooms)) == n, f"one room per prompt: {rooms}"
            assert set(hosts) == {"127.0.0.1"} and set(ports) == {port_of[engine.url]}, (hosts, ports)
            for r in rooms:
                assert isinstance(r, int) and 0 <= r < 2**63, r
                assert r not in prefilled, f"room {r} prefilled twice"
                prefilled[r] = (path, host, bport, room)
    decoded: dict[int, tuple] = {}
    for path, body in d.received:
        host, bport, room = sglang_fields(path, body)
        for r in room if isinstance(room, list) else [room]:
            assert r not in decoded, f"room {r} decoded twice"
            decoded[r] = (path, host, bport, room)
    assert decoded == prefilled, "each room's two legs carry the same fields"
    assert len(prefilled) == 2 * (5 + 3 + 2), "every prompt has its room"
    assert {e.url for e in (p1, p2) if e.received} == {p1.url, p2.url}, "both prefill engines used"
