"""Byte-exactness of loadlink's codec against SGLang 0.5.23's own msgspec structs."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from conftest import run_json, run_lines
from sglang_oracle import load_publisher, load_snapshot as ls

EDGE_INTS = [0, 1, 127, 128, 255, 256, 2**16 - 1, 2**16, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33, -129, -(2**31) - 1]
EDGE_FLOATS = [0.0, -0.0, 1.0, 0.5, 1e-300, 1e300, 123456.789, -2.5]
INT_FIELDS = [f for f in ls._CORE_KEYS if f not in ("timestamp", "token_usage", "gen_throughput", "cache_hit_rate", "utilization", "decode_moments")]
FLOAT_FIELDS = ["timestamp", "token_usage", "gen_throughput", "cache_hit_rate", "utilization"]
N_SNAPSHOTS = 1200
N_STATS = 1000


def rint(r: random.Random) -> int:
    return r.choice(EDGE_INTS) if r.random() < 0.5 else r.randrange(0, 1 << r.choice([7, 8, 16, 20, 32, 40]))


def rfloat(r: random.Random) -> float:
    return r.choice(EDGE_FLOATS) if r.random() < 0.3 else r.uniform(-1e6, 1e6) * r.random()


def make_snapshot(r: random.Random, collector_style: bool):
    """Keyword arguments and the SGLang struct. Collector style passes every float explicitly."""
    kw: dict = {}
    for f in INT_FIELDS:
        if r.random() < 0.7:
            kw[f] = rint(r)
    for f in FLOAT_FIELDS:
        if collector_style or r.random() < 0.3:
            kw[f] = rfloat(r)
    if r.random() < 0.4:
        kw["decode_moments"] = [rfloat(r) for _ in range(6)]
    if r.random() < 0.5:
        kw["memory"] = ls.MemoryMetrics(rfloat(r), rfloat(r), rfloat(r), rint(r))
    if r.random() < 0.5:
        kw["speculative"] = ls.SpeculativeMetrics(rfloat(r), rfloat(r))
    if r.random() < 0.5:
        kw["lora"] = ls.LoRAMetrics(rint(r), rint(r), rfloat(r))
    if r.random() < 0.5:
        kw["disaggregation"] = ls.DisaggregationMetrics(
            r.choice(["null", "prefill", "decode"]), *[rint(r) for _ in range(5)], rfloat(r), rfloat(r)
        )
    if r.random() < 0.5:
        kw["queues"] = ls.QueueMetrics(*[rint(r) for _ in range(5)])
    return kw, ls.LoadSnapshot(**kw)


def as_json_input(kw: dict) -> dict:
    out = {}
    for k, v in kw.items():
        out[k] = msgspec.structs.asdict(v) if isinstance(v, msgspec.Struct) else v
    return out


def full_dict(s) -> dict:
    return s.to_dict({"all"})


@pytest.fixture(scope="module")
def corpus():
    r = random.Random(20261130)
    snaps = [make_snapshot(r, collector_style=i % 4 != 0) for i in range(N_SNAPSHOTS)]
    snaps.append(({}, ls.LoadSnapshot()))
    return snaps


def test_golden_bytes():
    assert ls.snapshot_encoder.encode(ls.LoadSnapshot()).hex() == "de0000"
    out = run_json(["wire", "encode"], [{}, {"dp_rank": 1}, {"timestamp": 1.0, "dp_rank": 1, "num_running_reqs": 5}])
    want = [ls.snapshot_encoder.encode(s).hex() for s in (ls.LoadSnapshot(), ls.LoadSnapshot(dp_rank=1), ls.LoadSnapshot(timestamp=1.0, dp_rank=1, num_running_reqs=5))]
    assert out == want


def test_snapshot_bytes_equal_sglang(corpus):
    ours = run_json(["wire", "encode"], [as_json_input(kw) for kw, _ in corpus])
    assert len(ours) == len(corpus)
    mismatches = [(kw, o) for (kw, s), o in zip(corpus, ours) if o != ls.snapshot_encoder.encode(s).hex()]
    assert not mismatches, f"{len(mismatches)} snapshots differ, first: {mismatches[0]}"


def test_sglang_decodes_ours_and_we_decode_theirs(corpus):
    ours = run_json(["wire", "encode"], [as_json_input(kw) for kw, _ in corpus])
    for (kw, s), hexed in zip(corpus, ours):
        assert ls.snapshot_decoder.decode(bytes.fromhex(hexed)) == s
    decoded = run_lines(["wire", "decode"], [ls.snapshot_encoder.encode(s).hex() for _, s in corpus])
    for (kw, s), line in zip(corpus, decoded):
        got = json.loads(line)
        assert got["type"] == "LoadSnapshot", got
        assert got["value"] == full_dict(s)


def make_stat(r: random.Random):
    fields = [rint(r) for _ in range(4)] + [r.choice([None, 0, 1, 7, 300])] + [rint(r) for _ in range(5)]
    return load_publisher.LoadStat(*fields)


def test_stat_bytes_and_values_equal_sglang():
    r = random.Random(7)
    stats = [make_stat(r) for _ in range(N_STATS)] + [load_publisher.LoadStat(1, 2, 3, 4, 0)]
    enc = msgspec.msgpack.Encoder()
    ours = run_json(["wire", "encode", "--kind", "stat"], [msgspec.structs.asdict(s) for s in stats])
    assert ours == [enc.encode(s).hex() for s in stats]
    assert ours[-1] == "9ba84c6f61645374617401020304000000000000"
    dec = msgspec.msgpack.Decoder(load_publisher.LoadStat)
    assert all(dec.decode(bytes.fromhex(h)) == s for h, s in zip(ours, stats))
    decoded = run_lines(["wire", "decode"], [enc.encode(s).hex() for s in stats])
    for s, line in zip(stats, decoded):
        got = json.loads(line)
        assert got["type"] == "LoadStat"
        assert got["value"] == msgspec.structs.asdict(s)


def test_older_and_newer_shapes_decode():
    # 13-scalar engine (fields up to cache_hit_rate), 4-element queues, 6-element stat.
    old = {k: 3 for k in INT_FIELDS[:9]} | {"token_usage": 0.25}
    old_bytes = msgspec.msgpack.encode(old | {"queues": [1, 2, 3, 4]})
    got = json.loads(run_lines(["wire", "decode"], [old_bytes.hex()])[0])["value"]
    assert got["queues"]["prealloc_ready"] == 0 and got["token_usage"] == 0.25
    short = msgspec.msgpack.encode(["LoadStat", 1, 2, 3, 4, None])
    got = json.loads(run_lines(["wire", "decode"], [short.hex()])[0])
    assert got["value"]["num_tokens"] == 3 and got["value"]["attn_dp_rank"] is None
    bad = run_lines(["wire", "decode"], [msgspec.msgpack.encode(["Other", 1]).hex(), "c1", ""])
    assert all("error" in json.loads(b) for b in bad)
