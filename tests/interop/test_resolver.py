"""loadlink's generation-B port decisions equal SGLang's `resolve_load_pub_range` on every row."""

from __future__ import annotations

import json
import pathlib

from conftest import run_json
from sglang_oracle import kv_events

CASES = json.loads((pathlib.Path(__file__).parent / "resolver_cases.json").read_text())


def test_table_is_large_and_mixed():
    assert len(CASES) >= 60
    assert any(c["expect_a"] for c in CASES) and any(not c["expect_a"] for c in CASES)


def test_generation_b_matches_sglang_on_every_row():
    rows = [{k: c[k] for k in ("kv_endpoint", "replay_endpoint", "dp_size", "load_publish_endpoint")} for c in CASES]
    ours = [json.loads(line) for line in run_json(["wire", "resolve"], [r | {"generation": "loadstat"} for r in rows])]
    bad = []
    for row, got in zip(rows, ours):
        resolved, reason = kv_events.resolve_load_pub_range(**row)
        want = {"host": resolved[0], "base": resolved[1]} if resolved else {"declined": True, "quiet": reason is None}
        mine = {"declined": True, "quiet": got["reason"] is None} if got.get("declined") else got
        if mine != want:
            bad.append((row, want, got))
    assert not bad, f"{len(bad)} rows differ from SGLang; first: {bad[0]}"
