"""KV snapshots (`snapshot-v1`) and epochs of a running `loadlink engine`, read from Python:

* every snapshot reply decodes with msgspec into the documented shapes (typed header, end and
  error structs; records as `[parent|nil, [hashes]]` or with a medium), and the records' blocks
  equal `/cache_blocks` at the header's barrier seq, parents before children;
* SGLang 0.5.23's own `KVEventBatch` decoder reads the live payloads sent under the
  epoch-suffixed topic `{topic}\\0sgl-kv-epoch=N`, whose N is the epoch of `/server_info`,
  `/cache_blocks` and the snapshot header; `--kv-epoch-in-topic false` sends the bare topic.
"""

from __future__ import annotations

import json
from typing import Optional

import msgspec
import pytest

from live import get_json, join, post_json, recv, seq_of, start_engine, subscriber, wait_until
from sglang_oracle import kv_events as kv
from test_publish_interop import free_port_block
import zmq

PAGE = 4
DECODER = msgspec.msgpack.Decoder(kv.KVEventBatch)


class Header(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    epoch: int
    replica_rank: int
    barrier_seq: int
    resume_seq: int
    barrier_id: int
    record_count: int
    page_size: int
    hash_schema_version: int


class Chunk(msgspec.Struct, forbid_unknown_fields=True):
    barrier_id: int
    records: list[list]


class End(msgspec.Struct, forbid_unknown_fields=True):
    barrier_id: int
    record_count: int


def start(procs, *args: str) -> tuple[str, str, str]:
    """An engine with KV events and replay on 2 ranks: (url, PUB endpoint of rank 0, replay of rank 0)."""
    base = free_port_block(6)  # K, K+1: KV events; K+2, K+3: load; K+4, K+5: replay
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{base}", "replay_endpoint": f"tcp://*:{base + 4}"}
    url = start_engine(procs, free_port_block(1), "--dp-size", "2", "--page-size", str(PAGE),
                       "--kv-events-config", json.dumps(cfg), *args)
    return url, f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 4}"


def generate(url: str, input_ids: list[int]) -> dict:
    """SGLang's /generate on rank 0 (`routed_dp_rank`), one output token."""
    return post_json(url + "/generate", {"input_ids": input_ids, "routed_dp_rank": 0,
                                         "sampling_params": {"max_new_tokens": 1}})


def snapshot(endpoint: str, timeout: float = 15.0) -> tuple[Header, list[list], End]:
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    try:
        d.send_multipart([b"", b"snapshot-v1"])
        frames = recv(d, timeout)
        assert len(frames) == 3 and frames[0] == b"" and frames[1] == b"header", frames
        header = msgspec.msgpack.decode(frames[2], type=Header)
        records: list[list] = []
        while True:
            frames = recv(d, timeout)
            assert len(frames) == 3 and frames[0] == b"", frames
            if frames[1] == b"end":
                return header, records, msgspec.msgpack.decode(frames[2], type=End)
            assert frames[1] == b"chunk", frames[1]
            chunk = msgspec.msgpack.decode(frames[2], type=Chunk)
            assert chunk.barrier_id == header.barrier_id
            assert sum(len(r[1]) for r in chunk.records) <= 4096
            records += chunk.records
    finally:
        d.close(0)


def rank0_cache(url: str) -> dict:
    """/cache_blocks of rank 0, once two reads in a row agree (traffic has quiesced)."""
    last: list[Optional[dict]] = [None]

    def settled() -> bool:
        now = get_json(url + "/cache_blocks")["ranks"][0]
        same = now == last[0]
        last[0] = now
        return same

    wait_until("the cache to settle", settled)
    return last[0]


def test_snapshot_replies_decode_and_equal_cache_blocks_at_the_barrier(procs):
    url, _, replay = start(procs)
    a = list(range(1000, 1032))
    for i, prompt in enumerate([a, a[:16] + list(range(2000, 2016)), list(range(3000, 3040)), a]):
        generate(url, prompt)
    cache = rank0_cache(url)
    header, records, end = snapshot(replay)
    assert (header.version, header.hash_schema_version, header.page_size) == (1, 1, PAGE)
    assert header.replica_rank == 0
    assert header.barrier_seq == cache["seq"] >= 0 and header.resume_seq == header.barrier_seq + 1
    assert header.epoch == cache["epoch"] == get_json(url + "/server_info")["kv_events"]["epochs"][0]
    assert (end.barrier_id, end.record_count) == (header.barrier_id, header.record_count) == (
        header.barrier_id, len(records))
    seen: set[int] = set()
    for r in records:
        assert len(r) in (2, 3) and all(isinstance(h, int) for h in r[1]) and r[1]
        assert r[0] is None or r[0] in seen, f"record {r}: parent not sent before"
        seen.update(r[1])
    assert sorted(seen) == sorted(cache["blocks"]) and cache["blocks"]
    # B continued A's chain: fewer records than blocks.
    assert len(records) < len(seen)


def test_sglang_decodes_live_batches_under_the_epoch_topic(procs):
    url, pub, _ = start(procs)
    sub = subscriber(pub)
    first = join(sub, lambda i: generate(url, list(range(9000 + PAGE * 4 * i, 9000 + PAGE * 4 * (i + 1)))))
    generate(url, list(range(5000, 5032)))
    frames = [first]
    while not any(isinstance(e, kv.BlockStored) and e.token_ids[:1] == [5000]
                  for e in DECODER.decode(frames[-1][2]).events):
        frames.append(recv(sub))
    sub.close(0)
    epoch = get_json(url + "/server_info")["kv_events"]["epochs"][0]
    assert all(f[0] == b"\0sgl-kv-epoch=%d" % epoch for f in frames)
    seqs = [seq_of(f) for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for f in frames:
        batch = DECODER.decode(f[2])
        assert batch.attn_dp_rank == 0


def test_epoch_in_topic_can_be_turned_off(procs):
    url, pub, _ = start(procs, "--kv-epoch-in-topic", "false")
    sub = subscriber(pub)
    first = join(sub, lambda i: generate(url, list(range(9000 + PAGE * 4 * i, 9000 + PAGE * 4 * (i + 1)))))
    sub.close(0)
    assert first[0] == b""
    DECODER.decode(first[2])
    # The epoch is still advertised, and a restart would raise it.
    epochs = get_json(url + "/server_info")["kv_events"]["epochs"]
    assert len(epochs) == 2 and all(e > 1_700_000_000 * 10**9 for e in epochs)
