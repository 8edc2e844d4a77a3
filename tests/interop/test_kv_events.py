"""The KV-event stream's payload against SGLang 0.5.23's own msgspec structs
(`sglang/srt/disaggregation/kv_events.py`): for the same events our bytes equal SGLang's encoder's,
SGLang's decoder reads ours, and we read SGLang's."""

from __future__ import annotations

import hashlib
import json
import random

import msgspec

from conftest import run_json, run_lines
from sglang_oracle import kv_events as kv

EDGE = [0, 1, 127, 128, -1, -32, -33, -129, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]
N_BATCHES = 600


def rhash(r: random.Random) -> int:
    return r.choice(EDGE) if r.random() < 0.2 else r.randrange(-(2**63), 2**63)


def make_event(r: random.Random):
    pick = r.random()
    if pick < 0.6:
        pages = r.randrange(1, 6)
        size = r.choice([1, 16, 64])
        kw = dict(
            block_hashes=[rhash(r) for _ in range(pages)],
            parent_block_hash=None if r.random() < 0.3 else rhash(r),
            token_ids=[r.randrange(0, 200_000) for _ in range(pages * size)],
            block_size=size,
            lora_id=None if r.random() < 0.8 else r.randrange(0, 1000),
        )
        for opt in ("medium", "cache_salt", "session_id", "lora_name"):
            if r.random() < 0.3:
                kw[opt] = r.choice(["GPU", "CPU_PINNED", "s" * r.randrange(0, 40), "é"])
        return kv.BlockStored(**kw)
    if pick < 0.9:
        kw = dict(block_hashes=[rhash(r) for _ in range(r.randrange(0, 20))])
        if r.random() < 0.5:
            kw["medium"] = "GPU"
        return kv.BlockRemoved(**kw)
    return kv.AllBlocksCleared()


def corpus():
    r = random.Random(7)
    out = []
    for _ in range(N_BATCHES):
        events = [make_event(r) for _ in range(r.randrange(0, 8))]
        rank = None if r.random() < 0.3 else r.randrange(0, 16)
        out.append(kv.KVEventBatch(ts=r.uniform(0, 2e9), events=events, attn_dp_rank=rank))
    return out


def test_our_bytes_equal_sglangs_and_each_side_reads_the_other():
    batches = corpus()
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(kv.KVEventBatch)
    as_json = [msgspec.to_builtins(b) for b in batches]
    # msgspec.to_builtins writes a batch as a list; our JSON form names the three positions.
    ours = run_json(["wire", "encode", "--kind", "kv-batch"],
                    [{"ts": ts, "events": ev, "attn_dp_rank": rank} for ts, ev, rank in as_json])
    assert len(ours) == len(batches)
    for b, hexed in zip(batches, ours):
        assert bytes.fromhex(hexed) == enc.encode(b)
        assert dec.decode(bytes.fromhex(hexed)) == b
    decoded = [json.loads(x) for x in run_lines(["wire", "decode", "--kind", "kv-batch"],
                                                [enc.encode(b).hex() for b in batches])]
    for b, got in zip(batches, decoded):
        ts, events, rank = msgspec.to_builtins(b)
        assert got == {"ts": ts, "events": events, "attn_dp_rank": rank}


def test_unknown_event_type_is_an_error_naming_it():
    bad = msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "block_hashes": []}], None])
    got = json.loads(run_lines(["wire", "decode", "--kind", "kv-batch"], [bad.hex()])[0])
    assert "BlockMoved" in got["error"]


def test_page_hash_follows_sglangs_construction():
    """SGLang hashes a page as SHA-256(previous digest ‖ token ids as little-endian u32) in a
    compiled extension (`mem_cache/cpp_utils/hash_binding.cpp`) that needs torch to build, and
    publishes `hash_str_to_int64` of the hex digest. The chain is recomputed here with hashlib and
    SGLang's own `hash_str_to_int64` is imported from the wheel."""
    from sglang_oracle import mem_cache_utils

    tokens = list(range(1, 9))
    prior = None
    expected = []
    for page in (tokens[:4], tokens[4:]):
        h = hashlib.sha256()
        if prior:
            h.update(prior)
        for t in page:
            h.update(t.to_bytes(4, "little"))
        prior = h.digest()
        expected.append(mem_cache_utils.hash_str_to_int64(h.hexdigest()))
    got = json.loads(run_lines(["wire", "page-hashes", "--page-size", "4"], [json.dumps(tokens)])[0])
    assert got == expected
