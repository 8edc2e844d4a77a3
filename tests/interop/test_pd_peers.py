"""A prefill and a decode `loadlink engine` behind the real PD routers: sglang-router 0.3.2
(`python -m sglang_router.launch_router --pd-disaggregation`) and SMG 1.13 (`smg-1.13 launch
--pd-disaggregation`). Each peer sends every request to both engines with its bootstrap fields;
the engines move the room's KV between themselves over the bootstrap connection and the client
gets the decode engine's answer, JSON and SSE, on `/generate` and `/v1/chat/completions`.

What the peers call on workers (seen black-box, through a recording proxy): sglang-router 0.3.2
`GET /health`, `/model_info`, `/server_info` at registration; SMG 1.13 those plus `/v1/models`,
`/version`, `/loads?model=…` (SGLang 0.5.23 serves neither of the last two: a 404, which SMG
tolerates, as loadlink's engine answers) and periodic `/v1/loads?include=core,disagg,queues,memory`
and `/health`.

The peers stay on this machine: HF_ENDPOINT points at a closed loopback port (our simulated model
has no tokenizer on the hub)."""

from __future__ import annotations

import importlib.util
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
SMG = os.path.join(os.path.dirname(sys.executable), "smg-1.13")


def sglang_router_cmd() -> list[str]:
    if importlib.util.find_spec("sglang_router") is None:
        pytest.skip("sglang-router (0.3.2) is not installed in this Python")
    return [sys.executable, "-m", "sglang_router.launch_router"]


def smg_cmd() -> list[str]:
    if not os.access(SMG, os.X_OK):
        pytest.skip(f"SMG 1.13 is not installed ({SMG}; scripts/install-smg installs it)")
    return [SMG, "launch"]


PEERS = {"sglang-router-0.3.2": sglang_router_cmd, "smg-1.13": smg_cmd}


@dataclass
class PdFleet:
    router: str
    prefill: str
    decode: str
    log: str

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read())


@pytest.fixture(params=sorted(PEERS))
def fleet(request, procs, tmp_path) -> PdFleet:
    cmd = PEERS[request.param]()
    bootstrap = free_port_block(1)
    prefill = start_engine(procs, free_port_block(1), "--disaggregation-mode", "prefill",
                           "--disaggregation-bootstrap-port", str(bootstrap))
    decode = start_engine(procs, free_port_block(1), "--disaggregation-mode", "decode")
    port, prom = free_port_block(1), free_port_block(1)
    log = tmp_path / "router.log"
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    with open(log, "w") as out:
        router = procs.spawn(
            [*cmd, "--pd-disaggregation", "--prefill", prefill, str(bootstrap), "--decode", decode,
             "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    f = PdFleet(f"http://127.0.0.1:{port}", prefill, decode, str(log))

    def both_registered():
        assert router.poll() is None, f"router exited ({router.returncode}):\n{f.log_text()[-3000:]}"
        if not responds(f.router + "/health"):
            return False
        workers = get_json(f.router + "/workers")["workers"]
        return sorted(w["url"] for w in workers if w.get("is_healthy", True)) == sorted([prefill, decode])

    wait_until(f"{request.param} to register both engines", both_registered, timeout=60)
    return f


def metric(engine: str, name: str, **labels: str) -> float:
    """One sample of the engine's /metrics (0 when absent)."""
    status, body, _ = http_call(engine + "/metrics")
    assert status == 200
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}(?:\{{{re.escape(want)}\}})? (\S+)$" if want else rf"^{re.escape(name)} (\S+)$"
    m = re.search(pattern, body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def counts(f: PdFleet) -> dict[str, float]:
    """Requests and transferred rooms per side, and failed or timed-out rooms in all."""
    out = {}
    for side, url in [("prefill", f.prefill), ("decode", f.decode)]:
        out[f"{side}_requests"] = metric(url, "loadlink_engine_requests_total")
        out[f"{side}_rooms"] = metric(url, "loadlink_engine_pd_rooms_total", role=side, outcome="transferred")
        out[f"{side}_bad"] = sum(metric(url, "loadlink_engine_pd_rooms_total", role=side, outcome=o)
                                 for o in ("failed", "timeout"))
    return out


def sse_events(url: str, body: dict) -> list[str]:
    status, raw, headers = http_call(url, body)
    assert status == 200, raw[:300]
    ctype = headers.get("content-type", headers.get("Content-Type", ""))
    assert ctype.startswith("text/event-stream"), (ctype, raw[:300])
    return [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]


CASES = [
    ("/generate", {"text": "hello prefill and decode", "sampling_params": {"max_new_tokens": 5}}, 5),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}],
                              "max_tokens": 4}, 4),
]


def completion_tokens(path: str, answer: dict) -> int:
    return answer["meta_info"]["completion_tokens"] if path == "/generate" else answer["usage"]["completion_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_requests_complete_through_prefill_then_decode(fleet, stream):
    for path, body, tokens in CASES:
        before = counts(fleet)
        if stream:
            events = sse_events(fleet.router + path, {**body, "stream": True})
            assert events[-1] == "[DONE]", events[-3:]
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks and not any("error" in c for c in chunks), chunks
            if path == "/generate":
                # SGLang's stream carries the text so far: the last event has every token.
                last = chunks[-1]["meta_info"]
                got = last["completion_tokens"]
                assert last["finish_reason"]["type"] == "length"
            else:
                choices = [c["choices"][0] for c in chunks if c.get("choices")]
                got = sum((ch.get("delta", {}).get("content") or "").count("tok") for ch in choices)
                assert any(ch.get("finish_reason") == "length" for ch in choices), chunks
        else:
            got = completion_tokens(path, post_json(fleet.router + path, body))
        # A prefill engine answers exactly one token: all of them come from the decode engine.
        assert got == tokens, (path, stream, got)
        after = counts(fleet)
        delta = {k: after[k] - before[k] for k in after}
        # One room, prefilled once on the prefill engine and received once by the decode engine.
        assert delta == {"prefill_requests": 1, "prefill_rooms": 1, "prefill_bad": 0,
                         "decode_requests": 1, "decode_rooms": 1, "decode_bad": 0}, (path, stream, delta)


def test_both_engines_advertise_their_side(fleet):
    for url, mode in [(fleet.prefill, "prefill"), (fleet.decode, "decode")]:
        info = get_json(url + "/server_info")
        assert info["disaggregation_mode"] == mode
        loads = get_json(url + "/v1/loads?include=core,disagg,queues,memory")
        assert loads["loads"][0]["disaggregation"]["mode"] == mode
    assert isinstance(get_json(fleet.prefill + "/server_info")["disaggregation_bootstrap_port"], int)
