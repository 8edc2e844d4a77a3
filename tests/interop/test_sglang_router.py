"""Two `loadlink engine`s behind the real SGLang router (`sglang-router`, PyPI, pinned in
requirements.txt; a Rust binary wheel): JSON and SSE requests pass through it, and its
`power_of_two` policy routes on the loads it polls from the engines' `/get_load`.

The router is kept on this machine: it would look a worker's tokenizer up on the model hub (our
simulated model has none), so HF_ENDPOINT points at a closed loopback port and the hub is off."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from live import get_json, http as http_call, post_json, responds, start_engine, wait_until
from test_publish_interop import free_port_block

MODEL = "loadlink-sim"
# The router polls /get_load every --worker-startup-check-interval seconds (its LoadMonitor).
POLL_SECS = 1


@dataclass
class Fleet:
    router: str
    engines: list[str]
    log: str

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read())


@pytest.fixture
def fleet(procs, tmp_path) -> Fleet:
    engines = [start_engine(procs, free_port_block(1)) for _ in range(2)]
    port, prom = free_port_block(1), free_port_block(1)
    log = tmp_path / "router.log"
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    with open(log, "w") as out:
        router = procs.spawn(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *engines,
             "--policy", "power_of_two", "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
             "--worker-startup-check-interval", str(POLL_SECS), "--log-level", "debug"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    f = Fleet(url, engines, str(log))

    def both_registered():
        assert router.poll() is None, f"router exited ({router.returncode}):\n{f.log_text()[-3000:]}"
        if not responds(url + "/health"):
            return False
        workers = get_json(url + "/workers")["workers"]
        return sorted(w["url"] for w in workers if w["is_healthy"]) == sorted(engines)

    wait_until("the router to register both engines", both_registered, timeout=60)
    return f


def requests_total(engine: str) -> float:
    status, body, _ = http_call(engine + "/metrics")
    assert status == 200
    m = re.search(r"^loadlink_engine_requests_total (\S+)$", body.decode(), re.M)
    assert m, "loadlink_engine_requests_total missing from /metrics"
    return float(m.group(1))


def sse_events(url: str, body: dict) -> list[str]:
    status, raw, headers = http_call(url, body)
    assert status == 200, raw[:300]
    assert headers.get("content-type", headers.get("Content-Type", "")).startswith("text/event-stream")
    return [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_json_and_sse_pass_through_the_router(fleet):
    before = sum(requests_total(e) for e in fleet.engines)
    r = post_json(fleet.router + "/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 5})
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 5
    chat = post_json(fleet.router + "/v1/chat/completions",
                     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["completion_tokens"] == 3
    gen = post_json(fleet.router + "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    assert gen["meta_info"]["completion_tokens"] == 4

    for path, body in [
        ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 6, "stream": True,
                             "stream_options": {"include_usage": True}}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}),
    ]:
        events = sse_events(fleet.router + path, body)
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and all(c["model"] == MODEL for c in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == 6
    # Every request reached an engine.
    assert sum(requests_total(e) for e in fleet.engines) - before == 5


def router_loads(fleet: Fleet) -> dict[str, int]:
    """The router's own view of each worker's load (`GET /get_loads`): what it reads from each
    engine's /get_load, -1 where it could not read one."""
    return {w["worker"]: w["load"] for w in get_json(fleet.router + "/get_loads")["workers"]}


def test_power_of_two_routes_on_the_loads_it_polls(fleet):
    busy, idle = fleet.engines
    assert router_loads(fleet) == {busy: 0, idle: 0}, "the router could not read /get_load"
    # A long stream sent to one engine directly: load the router did not route and can only know
    # from /get_load.
    host, port = busy.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "x" * 3000, "max_tokens": 1_000_000, "stream": True}), {"Content-Type": "application/json"})
        stream = conn.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b"data: ")
        loads = wait_until("the router to see the direct load",
                           lambda: (lambda l: l if l[busy] > 0 and l[idle] == 0 else None)(router_loads(fleet)))
        assert loads[busy] >= 500
        # Two more polls by the LoadMonitor, so the policy's cached loads hold the busy engine.
        polls = lambda: fleet.log_text().count("Fetched loads from 2 workers")  # noqa: E731
        seen = polls()
        wait_until("two LoadMonitor polls", lambda: polls() >= seen + 2, timeout=15 * POLL_SECS)
        before = {e: requests_total(e) for e in fleet.engines}
        n = 12
        for i in range(n):
            post_json(fleet.router + "/v1/completions", {"model": MODEL, "prompt": f"q{i}", "max_tokens": 2})
        after = {e: requests_total(e) for e in fleet.engines}
    finally:
        conn.close()
    # Each pick compares both engines; the polled load sends every request to the idle one.
    assert after[idle] - before[idle] == n and after[busy] == before[busy], (before, after)
