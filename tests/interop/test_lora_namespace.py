"""Cache namespaces on the KV-event stream: a running `loadlink engine` publishes, for a LoRA
request, a `cache_salt` request, an `extra_key` request and a plain one, exactly the `BlockStored`
events SGLang 0.5.23's own event recorder publishes for the same radix nodes.

The oracle is SGLang's code from the wheel: `KVCacheEventRecorder.record_store` and
`KvEventLoraNames` (`mem_cache/events.py`), `kv_event_namespace_seed` and `namespaced_block_hash`
(`disaggregation/kv_events.py`), `get_hash_str`, `compute_node_event_hash_values` and
`hash_str_to_int64` (`mem_cache/utils.py`) and `LoRARef.deterministic_id`
(`lora/lora_registry.py`). `mem_cache/utils.py` and `lora_registry.py` import torch-only modules
at their top, so the functions named are compiled from the wheel's source alone (as
`sglang_oracle._functions_from` does). The one piece that is not SGLang's Python is the page hash
itself, a compiled extension: SHA-256(prior digest ‖ token ids as little-endian u32), as
`test_kv_events.test_page_hash_follows_sglangs_construction` checks it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import os
import sys
import types
import uuid
from typing import Any, Callable, List, Optional, Tuple

import msgspec
import pytest

import sglang_oracle  # registers the package shells
from live import generate, join, post_json, recv, start_engine, subscriber
from sglang_oracle import kv_events as kv
from test_publish_interop import free_port_block

PAGE = 4
DECODER = msgspec.msgpack.Decoder(kv.KVEventBatch)
ADAPTER = ("sql", "/adapters/sql")


def _native_hash(token_ids: Any, prior_digest: Optional[bytes], page_size: Optional[int] = None):
    """The compiled `get_native_hash`: SHA-256 of the prior digest and the page's ids as u32 LE,
    one hex digest per page (chained) when `page_size` is given."""
    ids = list(getattr(token_ids, "token_ids", token_ids))

    def one(page, prior):
        h = hashlib.sha256()
        if prior:
            h.update(prior)
        for t in page:
            h.update(int(t).to_bytes(4, "little"))
        return h.digest()

    if page_size is None:
        return one(ids, prior_digest).hex()
    out, prior = [], prior_digest
    for i in range(0, len(ids), page_size):
        prior = one(ids[i:i + page_size], prior)
        out.append(prior.hex())
    return out


def _compile(relpath: str, pick: Callable[[ast.Module], list], scope: dict) -> dict:
    """Compiles the definitions `pick` selects from a wheel file into `scope`."""
    path = os.path.join(sys.modules["sglang"].__path__[0], relpath)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    body = pick(tree)
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)
    return scope


def _utils_module() -> types.ModuleType:
    names = {"get_hash_str", "hash_str_to_int64", "storage_namespace_seed", "get_storage_hash_str",
             "compute_node_hash_values", "compute_node_event_hash_values"}
    scope = {"hashlib": hashlib, "Any": Any, "List": List, "Optional": Optional, "Tuple": Tuple,
             "get_native_hash": _native_hash}

    def pick(tree):
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        missing = names - {n.name for n in found}
        assert not missing, f"mem_cache/utils.py no longer defines {sorted(missing)}"
        return found

    mod = types.ModuleType("sglang.srt.mem_cache.utils")
    mod.__dict__.update(_compile("srt/mem_cache/utils.py", pick, scope))
    return mod


def _deterministic_id() -> Callable[[str, str], str]:
    def pick(tree):
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LoRARef")
        fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "deterministic_id")
        fn.decorator_list = []  # a staticmethod, compiled as a plain function
        return [fn]

    scope = {"NAMESPACE_URL": uuid.NAMESPACE_URL, "uuid5": uuid.uuid5}
    return _compile("srt/lora/lora_registry.py", pick, scope)["deterministic_id"]


def _events_module() -> types.ModuleType:
    """SGLang's `mem_cache/events.py`, run as is, over the compiled `mem_cache/utils` functions."""
    root = sys.modules["sglang"].__path__[0]
    pkg = types.ModuleType("sglang.srt.mem_cache")
    pkg.__path__ = [os.path.join(root, "srt", "mem_cache")]
    sys.modules.setdefault(pkg.__name__, pkg)
    sys.modules.setdefault("sglang.srt.mem_cache.utils", _utils_module())
    return importlib.import_module("sglang.srt.mem_cache.events")


EVENTS = _events_module()
UTILS = sys.modules["sglang.srt.mem_cache.utils"]
LORA_ID = _deterministic_id()(*ADAPTER)


class Key:
    """A radix key as the recorder reads it: token ids and the namespace."""

    def __init__(self, ids, extra_key=None, cache_salt=None):
        self.token_ids, self.extra_key, self.cache_salt = list(ids), extra_key, cache_salt
        self.is_bigram = False

    def __len__(self):
        return len(self.token_ids)


class Node:
    def __init__(self, key: Key, parent: Optional["Node"]):
        self.key, self.parent = key, parent
        self.hash_value = [] if parent is None else None
        self.event_hash_value = None


def sglang_stores(namespace: dict, pages: list[list[int]]) -> list[dict]:
    """What SGLang's recorder publishes when a request of `namespace` ({lora, extra_key,
    cache_salt}) inserts one radix node per entry of `pages` (each a child of the last), as
    builtins."""
    names = EVENTS.KvEventLoraNames.from_lora_refs(
        [types.SimpleNamespace(lora_id=LORA_ID, lora_name=ADAPTER[0])])
    rec = EVENTS.KVCacheEventRecorder(enabled=True, page_size=PAGE, lora_names=names)
    extra_key = namespace.get("extra_key")
    lora_id = LORA_ID if namespace.get("lora") else None
    if lora_id is not None:  # Req.__init__: the adapter's id joins the extra key
        extra_key = (extra_key or "") + lora_id
    # The scheduler names the request's namespace when it takes the request in.
    names.register(types.SimpleNamespace(extra_key=extra_key, lora_id=lora_id), namespace.get("lora"))
    node = Node(Key([]), None)
    out = []
    for ids in pages:
        node = Node(Key(ids, extra_key, namespace.get("cache_salt")), node)
        rec.record_store(node)
        out.extend(msgspec.to_builtins(e) for e in rec.take())
    return out


def stored_events(frames: list[bytes]) -> list[dict]:
    batch = DECODER.decode(frames[2])
    return [msgspec.to_builtins(e) for e in batch.events if isinstance(e, kv.BlockStored)]


def next_stores(sub, first_token: int) -> list[dict]:
    """The stores of the next batch that stores a chain starting with `first_token`."""
    while True:
        stores = [s for s in stored_events(recv(sub)) if s["token_ids"][:1] == [first_token]]
        if stores:
            return stores


@pytest.fixture
def lora_engine(procs):
    kv_port = free_port_block(2)
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}"}
    url = start_engine(procs, free_port_block(1), "--page-size", str(PAGE),
                       "--lora-paths", f"{ADAPTER[0]}={ADAPTER[1]}",
                       "--kv-events-config", json.dumps(cfg))
    sub = subscriber(f"tcp://127.0.0.1:{kv_port}")
    # Slow joiner: plain warm-up prompts (tokens far from the test's) until one is received.
    join(sub, lambda i: generate(url, list(range(90_000 + 100 * i, 90_000 + 100 * i + 5))))
    yield url, sub
    sub.close(0)


NAMESPACES = [
    ("plain", {}),
    ("extra_key", {"extra_key": "tenant-a"}),
    ("cache_salt", {"cache_salt": "salt-1"}),
    ("lora", {"lora": ADAPTER[0]}),
    ("lora+salt+key", {"lora": ADAPTER[0], "cache_salt": "salt-1", "extra_key": "tenant-a"}),
]


def test_the_seed_the_engine_names_is_sglangs():
    """The adapter id the engine derives (seen through its hashes below) is SGLang's uuid5, and the
    seed SGLang's recorder uses for it is `kv_event_namespace_seed(extra_key ++ lora_id, None)`."""
    assert LORA_ID == uuid.uuid5(uuid.NAMESPACE_URL, "sql\0/adapters/sql").hex
    seed = kv.kv_event_namespace_seed(extra_key=LORA_ID, cache_salt=None)
    assert kv.namespaced_block_hash(7, namespace_seed=seed) != 7
    assert UTILS.hash_str_to_int64("8" + "0" * 63) == -(2**63)


def test_each_namespace_publishes_sglangs_stores(lora_engine):
    url, sub = lora_engine
    prompt = list(range(1000, 1013))  # 13 ids: three full pages cached after one output token
    longer = prompt[:12] + list(range(2000, 2009))  # continues the first three pages by two
    for label, ns in NAMESPACES:
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}
        if ns.get("lora"):
            body["lora_path"] = ns["lora"]
        body.update({k: v for k, v in ns.items() if k in ("cache_salt", "extra_key")})
        post_json(url + "/generate", body)
        got = next_stores(sub, prompt[0])
        want = sglang_stores(ns, [prompt[:12]])
        assert got == want, f"{label}: engine {got} vs SGLang {want}"
        # A continuation in the same namespace chains from its own published parent.
        body["input_ids"] = longer
        post_json(url + "/generate", body)
        got = next_stores(sub, longer[12])
        want = sglang_stores(ns, [prompt[:12], longer[12:20]])[-1:]
        assert got == want, f"{label} continuation: engine {got} vs SGLang {want}"


def test_an_adapter_or_salt_changes_every_hash_an_extra_key_alone_none(lora_engine):
    """The property a router relies on, read off SGLang's recorder: its default format tells
    adapters and salts apart, not a bare extra_key."""
    pages = [list(range(10, 22))]
    hashes = {label: sglang_stores(ns, pages)[0]["block_hashes"] for label, ns in NAMESPACES}
    assert hashes["extra_key"] == hashes["plain"]
    distinct = [hashes[k] for k in ("plain", "cache_salt", "lora", "lora+salt+key")]
    for i, a in enumerate(distinct):
        for b in distinct[i + 1:]:
            assert not set(a) & set(b)
