"""The KV-event stream live, across the two implementations:

* SGLang 0.5.23's decoder (`msgspec.msgpack.Decoder(KVEventBatch)`) reads a running
  `loadlink engine`'s frames, and what they say is true of the engine's prefix cache: stored
  blocks chain onto their parent, hash like `loadlink wire page-hashes`, and are removed only
  after being stored (a tiny KV pool forces evictions).
* `loadlink wire listen --kind kv-batch` reads SGLang's own `ZmqEventPublisher` from the wheel.
* Replay after a forced gap: the same DEALER request against the engine and against SGLang's
  publisher returns the missed batches in order, byte-identical to the live frames, then the same
  end marker.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

import msgspec
import pytest

from conftest import loadlink_bin, run_lines
from live import (END_SEQ, LineReader, generate, get_json, join, recv, replay, seq_of,
                  start_engine, subscriber, wait_until)
from sglang_oracle import kv_events as kv
from test_kv_events import corpus as kv_corpus
from test_publish_interop import free_port_block

PAGE = 4
POOL = 64  # tokens: two 32-token prompts fill it, so a third evicts
DECODER = msgspec.msgpack.Decoder(kv.KVEventBatch)


def page_hashes(seqs: list[list[int]]) -> list[list[int]]:
    out = run_lines(["wire", "page-hashes", "--page-size", str(PAGE)], [json.dumps(s) for s in seqs])
    return [json.loads(x) for x in out]


def tokens(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


@dataclass
class KvEngine:
    url: str
    pub: str
    replay: str


@pytest.fixture
def kv_engine(procs) -> KvEngine:
    base = free_port_block(3)  # K: KV events, K+1: the load socket, K+2: replay
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{base}", "replay_endpoint": f"tcp://*:{base + 2}"}
    url = start_engine(procs, free_port_block(1), "--page-size", str(PAGE), "--max-total-tokens", str(POOL),
                       "--kv-events-config", json.dumps(cfg))
    return KvEngine(url, f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 2}")


def stored_with(frames: list[bytes], first_token: int) -> bool:
    """Whether the batch stores a block chain whose first token is `first_token`."""
    return any(isinstance(e, kv.BlockStored) and e.token_ids[:1] == [first_token]
               for e in DECODER.decode(frames[2]).events)


def read_through(sub, done: Callable[[list[bytes]], bool]) -> list[list[bytes]]:
    """Live frames up to and including the first one `done` accepts (batches arrive in order)."""
    got = []
    while True:
        got.append(recv(sub))
        if done(got[-1]):
            return got


def check_stream(batches: list) -> tuple[list[set[int]], list[tuple[str, int]]]:
    """Replays the events against a model of the cache, asserting each is possible: a stored
    chain's parent is cached, its hashes are the page hashes of its tokens from the root, a block is
    never stored twice while cached, and only cached blocks are removed. Returns the cached set
    after each batch and the (store|remove, hash) history."""
    path: dict[int, list[int]] = {}  # block hash -> its tokens from the root
    cached: set[int] = set()
    after: list[set[int]] = []
    history: list[tuple[str, int]] = []
    pending: list[tuple[object, list[int]]] = []
    for b in batches:
        assert b.attn_dp_rank == 0 and b.ts > 0
        for e in b.events:
            if isinstance(e, kv.BlockStored):
                assert e.block_size == PAGE and e.lora_id is None
                assert len(e.token_ids) == PAGE * len(e.block_hashes) and e.block_hashes
                if e.parent_block_hash is None:
                    prefix = []
                else:
                    assert e.parent_block_hash in cached, f"parent {e.parent_block_hash} is not cached"
                    prefix = path[e.parent_block_hash]
                for i, h in enumerate(e.block_hashes):
                    assert h not in cached, f"block {h} stored while already cached"
                    cached.add(h)
                    path[h] = prefix + e.token_ids[: (i + 1) * PAGE]
                    history.append(("store", h))
                pending.append((e, prefix + e.token_ids))
            elif isinstance(e, kv.BlockRemoved):
                for h in e.block_hashes:
                    assert h in cached, f"block {h} removed but not cached"
                    cached.remove(h)
                    history.append(("remove", h))
            else:
                assert isinstance(e, kv.AllBlocksCleared)
                cached.clear()
        after.append(set(cached))
    # Each stored chain hashes as SGLang hashes its tokens from the root (one tool call for all).
    for (e, seq), want in zip(pending, page_hashes([s for _, s in pending])):
        assert e.block_hashes == want[len(seq) // PAGE - len(e.block_hashes):]
    return after, history


def test_sglang_decodes_the_engines_live_stream(kv_engine):
    a, c, d = tokens(1000, 32), tokens(3000, 32), tokens(4000, 32)
    b = a[:16] + tokens(2000, 16)  # continues A's first four pages
    script = [a, a, b, c, d, a]
    sentinel = tokens(7000, PAGE)
    sub = subscriber(kv_engine.pub)
    # Single-page warm-up prompts until the subscription is live.
    first = join(sub, lambda i: generate(kv_engine.url, tokens(9000 + PAGE * i, PAGE)))
    for prompt in script + [sentinel]:
        generate(kv_engine.url, prompt)
    live = [first] + read_through(sub, lambda f: stored_with(f, sentinel[0]))
    sub.close(0)
    # What went by before the subscription joined comes from the replay buffer.
    older, _ = replay(kv_engine.replay, 0)
    frames = [r[1:] for r in older if seq_of(r[1:]) < seq_of(first)] + live
    assert [seq_of(f) for f in frames] == list(range(len(frames))), "a gap or reorder in the stream"
    # The empty topic, with the engine's epoch appended (`{topic}\0sgl-kv-epoch=N`, on by default).
    epoch = get_json(f"{kv_engine.url}/server_info")["kv_events"]["epochs"][0]
    assert all(f[0] == b"\0sgl-kv-epoch=%d" % epoch for f in frames)

    batches = [DECODER.decode(f[2]) for f in frames]
    after, history = check_stream(batches)
    ha, hb = page_hashes([a, b])
    assert ha[:4] == hb[:4]
    # Every prompt's pages were all cached at once, after its request.
    for prompt, hashes in zip(script, page_hashes(script)):
        assert len(hashes) == len(prompt) // PAGE
        assert any(set(hashes) <= s for s in after), f"pages of the prompt at {prompt[0]} never all cached"
    # B continued A's chain: parent = A's fourth block, only B's own pages announced.
    stored = [e for bt in batches for e in bt.events if isinstance(e, kv.BlockStored)]
    (cont,) = [e for e in stored if e.token_ids[:1] == [b[16]]]
    assert cont.parent_block_hash == ha[3] and cont.block_hashes == hb[4:] and cont.token_ids == b[16:]
    # The tiny pool evicted, and A, asked for again, was stored again.
    removed = {h for op, h in history if op == "remove"}
    assert removed, "no BlockRemoved although the pool holds two prompts"
    restored = [h for i, (op, h) in enumerate(history) if op == "store" and ("remove", h) in history[:i]]
    assert set(ha) & set(restored), "A was never evicted and stored again"


def test_loadlink_listen_reads_sglangs_publisher(procs):
    base = free_port_block(2)
    # Rank 1 binds the configured port + 1, as each DP rank does.
    pub = kv.ZmqEventPublisher(attn_dp_rank=1, endpoint=f"tcp://*:{base}")
    try:
        listen = procs.spawn([loadlink_bin(), "wire", "listen", "--kind", "kv-batch", f"tcp://127.0.0.1:{base + 1}",
                              "--timeout", "60"], stdout=subprocess.PIPE, text=True)
        lines = LineReader(listen)
        # Empty probe batches until the listener has joined (its first line proves it).
        wait_until("loadlink wire listen to join",
                   lambda: pub.publish(kv.KVEventBatch(ts=0.5, events=[])) or not lines.lines.empty())
        # SGLang's publisher fills in its own rank for batches that carry none.
        batches = [x for x in kv_corpus()[:60] if x.events]
        for x in batches:
            pub.publish(x)
        got = []
        while len(got) < len(batches):
            line = json.loads(lines.next())
            assert "error" not in line, line
            if line["payload"]["events"]:
                got.append(line)
    finally:
        pub.shutdown()
    assert [g["seq"] for g in got] == list(range(got[0]["seq"], got[0]["seq"] + len(got)))
    assert 1 in {x.attn_dp_rank for x in batches}
    for x, g in zip(batches, got):
        ts, events, rank = msgspec.to_builtins(x)
        assert g["topic"] == "" and g["payload"] == {"ts": ts, "events": events, "attn_dp_rank": rank}


@dataclass
class Source:
    """A KV-event publisher under test: where it publishes and replays, how to make it publish
    batch i, and which i (if any) a received message is."""

    pub: str
    replay: str
    emit_one: Callable[[int], None]
    mark: Callable[[list[bytes]], Optional[int]]
    emitted: int = 0

    def emit(self, _=None) -> int:
        self.emit_one(self.emitted)
        self.emitted += 1
        return self.emitted - 1


def engine_source(eng: KvEngine) -> Source:
    base = 50_000

    def emit(i: int) -> None:
        generate(eng.url, tokens(base + 2 * PAGE * i, 2 * PAGE))

    def mark(frames: list[bytes]) -> Optional[int]:
        for e in DECODER.decode(frames[2]).events:
            if isinstance(e, kv.BlockStored) and e.token_ids and e.token_ids[0] >= base:
                return (e.token_ids[0] - base) // (2 * PAGE)
        return None

    return Source(eng.pub, eng.replay, emit, mark)


@pytest.fixture(params=["loadlink-engine", "sglang-ZmqEventPublisher"])
def source(request, procs):
    if request.param == "loadlink-engine":
        yield engine_source(request.getfixturevalue("kv_engine"))
        return
    base = free_port_block(2)
    pub = kv.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://*:{base}", replay_endpoint=f"tcp://*:{base + 1}")

    def emit(i: int) -> None:
        pub.publish(kv.KVEventBatch(ts=float(i + 1), events=[kv.BlockStored(
            block_hashes=[i], parent_block_hash=None, token_ids=tokens(i, PAGE), block_size=PAGE, lora_id=None)]))

    try:
        yield Source(f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}", emit,
                     lambda f: int(DECODER.decode(f[2]).ts) - 1)
    finally:
        pub.shutdown()


def test_replay_after_a_forced_gap(source: Source):
    """Subscribe, let batches pass while unsubscribed, resubscribe, then ask the replay socket for
    everything from just before the gap. The same request and checks run against both sides."""
    sub = subscriber(source.pub)
    live = [join(sub, source.emit)]
    for _ in range(2):
        source.emit()
    live += read_through(sub, lambda f: source.mark(f) == source.emitted - 1)
    sub.close(0)
    gap_marks = [source.emit() for _ in range(3)]  # published while nobody listens
    # Publishing is asynchronous on both sides: resubscribe only once the replay buffer shows the
    # gap batches went out, so none of them can reach the new subscriber live.
    wait_until("the gap batches to be published", lambda: set(gap_marks) <= {
        source.mark(r[1:]) for r in replay(source.replay, seq_of(live[-1]) + 1)[0]})
    sub = subscriber(source.pub)
    live2 = [join(sub, source.emit)]
    source.emit()
    live2 += read_through(sub, lambda f: source.mark(f) == source.emitted - 1)
    sub.close(0)
    assert seq_of(live2[0]) > seq_of(live[-1]) + 3, "the unsubscribed batches were not a gap"

    start = seq_of(live[-2])
    replies, end = replay(source.replay, start)
    assert end == [b"", b"", END_SEQ, b""]
    assert all(len(r) == 4 and r[0] == b"" and len(r[2]) == 8 for r in replies)
    seqs = [seq_of(r[1:]) for r in replies]
    assert seqs == list(range(start, start + len(replies))), "replay is not the in-order tail"
    assert seqs[-1] >= seq_of(live2[-1])
    by_seq = {seq_of(r[1:]): r[1:] for r in replies}
    for f in live[-2:] + live2:
        assert by_seq[seq_of(f)] == f, f"replayed seq {seq_of(f)} differs from the live frame"
    missed = [by_seq[s] for s in range(seq_of(live[-1]) + 1, seq_of(live2[0]))]
    assert set(gap_marks) <= {source.mark(f) for f in missed}
    for f in missed:
        DECODER.decode(f[2])
    # A start past the newest batch: just the end marker.
    assert replay(source.replay, seqs[-1] + 1000) == ([], [b"", b"", END_SEQ, b""])
