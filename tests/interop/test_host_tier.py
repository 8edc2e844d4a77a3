"""A `loadlink engine` with a host KV tier (`--hicache-size`), read by SGLang 0.5.23's decoder.

HiCache announces a page once per tier: `BlockStored(CPU_PINNED)` when its host copy lands,
`BlockRemoved(GPU)` when the device copy goes, `BlockRemoved(CPU_PINNED)` when the host copy goes,
and a device `BlockStored` when a host page is loaded back. Replayed against a two-tier model of
the cache, every event of the engine's stream must be possible in that order: a device store
chains onto a device parent, a host copy onto a parent held on some tier, and a page leaves the
device only once its host copy exists. A session pushed off the device comes back from the host.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from live import get_json, generate, join, replay, seq_of, start_engine, subscriber
from sglang_oracle import kv_events as kv
from test_kv_stream import page_hashes, read_through, stored_with, tokens
from test_publish_interop import free_port_block

PAGE = 4
POOL = 64  # device tokens: two 32-token prompts fill it
HOST = 256  # host tokens
DECODER = msgspec.msgpack.Decoder(kv.KVEventBatch)
GPU, CPU = kv.StorageMedium.GPU.value, kv.StorageMedium.CPU.value


@pytest.fixture
def hicache_engine(procs):
    base = free_port_block(3)
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{base}", "replay_endpoint": f"tcp://*:{base + 2}"}
    url = start_engine(procs, free_port_block(1), "--page-size", str(PAGE), "--max-total-tokens", str(POOL),
                       "--hicache-size", str(HOST), "--hicache-load-rate", "50000",
                       "--kv-events-config", json.dumps(cfg))
    return url, f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 2}"


def replay_tiers(batches) -> list[tuple[str, str, list[int], set[int]]]:
    """Applies the events to a two-tier model, asserting each is possible in its order; returns
    (kind, medium, hashes, host pages before the event) per block event."""
    device: set[int] = set()
    host: set[int] = set()
    log = []
    for b in batches:
        for e in b.events:
            if isinstance(e, kv.AllBlocksCleared):
                device.clear()
                host.clear()
                continue
            medium = e.medium or GPU
            assert medium in (GPU, CPU), f"medium {medium!r}"
            log.append((type(e).__name__, medium, list(e.block_hashes), set(host)))
            if isinstance(e, kv.BlockStored):
                parent = e.parent_block_hash
                for h in e.block_hashes:
                    if medium == GPU:
                        assert parent is None or parent in device, "a device page under a parent off the device"
                        assert h not in device
                        device.add(h)
                    else:
                        assert parent is None or parent in device or parent in host, "a host copy without parent"
                        assert h not in host
                        host.add(h)
                    parent = h
            else:
                for h in e.block_hashes:
                    if medium == GPU:
                        assert h in device and h in host, f"{h} left the device before its host copy landed"
                        device.remove(h)
                    else:
                        assert h in host
                        host.remove(h)
    return log


def test_sglang_decodes_demotion_host_eviction_and_load_back_in_order(hicache_engine):
    url, pub, replay_ep = hicache_engine
    info = get_json(url + "/server_info")
    assert info["hicache_size_tokens"] == HOST and info["hicache_load_tokens_per_s"] == 50000
    a, c, d = tokens(1000, 32), tokens(3000, 32), tokens(4000, 32)
    others = [tokens(5000 + 100 * i, 32) for i in range(8)]  # enough to overflow the host pool too
    sentinel = tokens(7000, PAGE)
    sub = subscriber(pub)
    first = join(sub, lambda i: generate(url, tokens(9000 + PAGE * i, PAGE)))
    for prompt in [a, c, d, a] + others + [sentinel]:
        generate(url, prompt)
    live = [first] + read_through(sub, lambda f: stored_with(f, sentinel[0]))
    sub.close(0)
    older, _ = replay(replay_ep, 0)
    frames = [r[1:] for r in older if seq_of(r[1:]) < seq_of(first)] + live
    assert [seq_of(f) for f in frames] == list(range(len(frames))), "a gap or reorder in the stream"
    log = replay_tiers([DECODER.decode(f[2]) for f in frames])

    (ha,) = page_hashes([a])
    kinds = {(k, m) for k, m, _, _ in log}
    assert ("BlockStored", CPU) in kinds, "no demotion announced"
    assert ("BlockRemoved", CPU) in kinds, "no host eviction announced"
    # A was demoted page by page, then asked for again: its pages off the device came back from
    # the host in one device store, in chain order, before the host evicted them.
    demoted = [hs[0] for k, m, hs, _ in log if (k, m) == ("BlockStored", CPU)]
    assert set(ha) & set(demoted), "A never reached the host"
    loads = [hs for k, m, hs, before in log if (k, m) == ("BlockStored", GPU) and set(hs) <= before and hs]
    back = [hs for hs in loads if set(hs) <= set(ha)]
    assert back, "A was not loaded back from the host"
    i = ha.index(back[0][0])
    assert back[0] == ha[i:i + len(back[0])]
