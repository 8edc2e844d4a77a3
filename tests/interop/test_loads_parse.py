"""The router's `/v1/loads` parser reads what SGLang 0.5.23 serves.

The document is rendered by SGLang's own code: its `LoadSnapshot.to_dict` (the real
`sglang.srt.managers.load_snapshot` module) and its `/v1/loads` handler, `get_loads` in
`sglang/srt/entrypoints/v1_loads.py`, compiled from the installed wheel without its FastAPI
decorator (the module's imports need torch). Only the handler's collaborators are stubbed: the
tokenizer manager that hands it the snapshots, the accelerator name and count. The JSON it returns
is fed to `loadlink wire parse-loads`, the parser the router's poller uses.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import types
from datetime import datetime, timezone

import pytest

from conftest import loadlink_bin
from sglang_oracle import load_snapshot

LS = load_snapshot.LoadSnapshot


def _handler() -> types.SimpleNamespace:
    """`get_loads` from the wheel, undecorated, with its module-level names stubbed."""
    path = os.path.join(sys.modules["sglang"].__path__[0], "srt/entrypoints/v1_loads.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    body = []
    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "get_loads":
            node.decorator_list = []
            body.append(node)
    if not body:
        raise RuntimeError("v1_loads.py no longer defines get_loads")

    class HTTPException(Exception):
        def __init__(self, status_code, detail):
            super().__init__(detail)
            self.status_code = status_code

    scope = {
        "Optional": __import__("typing").Optional,
        "time": __import__("time"),
        "datetime": datetime,
        "timezone": timezone,
        "HTTPException": HTTPException,
        "Depends": lambda f: None,
        "_get_tokenizer_manager": None,
        "_accelerator_name": lambda: "NVIDIA H100 80GB HBM3",
        "_num_accelerators_per_dp_rank": lambda: 8,
        "__version__": "0.5.23",
        "_format_loads_prometheus": None,
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)
    return types.SimpleNamespace(get_loads=scope["get_loads"])


HANDLER = _handler()


class TokenizerManager:
    """What `get_loads` asks for its snapshots (SGLang's `TokenizerControlMixin.get_loads`)."""

    def __init__(self, snaps):
        self.snaps = snaps

    async def get_loads(self, include=None, dp_rank=None):
        return [s for s in self.snaps if dp_rank is None or s.dp_rank == dp_rank]


def serve(snaps, include=None) -> str:
    doc = asyncio.run(HANDLER.get_loads(dp_rank=None, include=include, format=None,
                                        tokenizer_manager=TokenizerManager(snaps)))
    return json.dumps(doc)


def parse(body: str) -> list[dict]:
    proc = subprocess.run([loadlink_bin(), "wire", "parse-loads"], input=body,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def ranks() -> list:
    return [
        LS(timestamp=1796031644.5, dp_rank=1, num_running_reqs=12, num_waiting_reqs=7,
           num_waiting_uncached_tokens=5120, num_used_tokens=40000, num_total_tokens=46000,
           num_active_tokens=46000, max_total_num_tokens=200000, max_running_requests=128,
           token_usage=0.23, gen_throughput=1830.5, cache_hit_rate=0.41, utilization=0.97,
           total_prefill_uncached_tokens=9_000_000, total_prefill_busy_us=123_456_789,
           decode_moments=[10.0, 640.0, 1.5e5, 4.1e4, 9.6e6, 640.0],
           memory=load_snapshot.MemoryMetrics(60.1, 12.5, 1.25, 200000),
           speculative=load_snapshot.SpeculativeMetrics(2.5, 0.7),
           queues=load_snapshot.QueueMetrics(7, 0, 0, 1, 0),
           disaggregation=load_snapshot.DisaggregationMetrics("decode", decode_prealloc_queue_reqs=3)),
        LS(dp_rank=0, num_running_reqs=3),
    ]


CORE = [f for f in LS.__struct_fields__ if f not in ("memory", "speculative", "lora", "disaggregation", "queues", "decode_moments")]


@pytest.mark.parametrize("include", [None, "core", "memory,queues,disagg", "all"])
def test_parser_reads_sglangs_own_v1_loads_document(include):
    snaps = ranks()
    body = serve(snaps, include)
    assert json.loads(body)["version"] == "0.5.23"
    got = parse(body)
    assert len(got) == 2, got
    want = sorted(snaps, key=lambda s: s.dp_rank)
    for g, w in zip(got, want):
        for field in CORE:
            assert g[field] == pytest.approx(getattr(w, field)), (field, g, w)


def test_parser_names_what_a_broken_document_lacks():
    doc = json.loads(serve(ranks()))
    del doc["loads"][1]["num_waiting_reqs"]
    (err,) = parse(json.dumps(doc))
    assert "num_waiting_reqs" in err["error"] and "loads[1]" in err["error"], err
