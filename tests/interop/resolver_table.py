"""The shared resolver table: rows of (kv_endpoint, replay_endpoint, dp_size, load_publish_endpoint).

Generation B's expected decision for each row comes live from SGLang's `resolve_load_pub_range`
(test_resolver.py). Generation A has no SGLang implementation in 0.5.23, so `expect_a` is written
from the rule in PROTOCOL.md §4 by `generation_a_rule` below — a separate statement of the rule,
kept deliberately plain — and checked against loadlink's resolver by the Rust test
`crates/wire/tests/resolver_table.rs`. Regenerate with `python resolver_table.py > resolver_cases.json`.
"""

from __future__ import annotations

import ipaddress
import json

KV = [None, "tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://127.0.0.1:5557",
      "tcp://[2001:db8::1]:5557", "tcp://::1:5557", "ipc:///tmp/kv", "inproc://kv", "tcp://*:65530", "tcp://*:65535"]
REPLAY = [None, "tcp://*:5558", "tcp://*:5600", "tcp://10.0.0.2:5559"]
DP = [1, 2, 8]
MODES = [None, "off", "auto", "tcp://*:7000", "tcp://127.0.0.1:7000", "tcp://*:5556", "tcp://[::]:65535", "ipc:///x"]


def rows():
    out = []
    for kv in KV:
        for mode in MODES:
            for dp in DP:
                for replay in REPLAY if kv else [None]:
                    out.append({"kv_endpoint": kv, "replay_endpoint": replay, "dp_size": dp, "load_publish_endpoint": mode})
    return out


def _parse(ep):
    if not ep or not ep.startswith("tcp://"):
        return None
    rest = ep[len("tcp://"):]
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    else:
        host, _, port = rest.rpartition(":")
        if not host or ":" in host:
            return None
    return (host, int(port)) if port.isdigit() and 0 < int(port) < 65536 else None


def generation_a_rule(row):
    """PROTOCOL.md §4, generation A, plus loadlink's off / explicit-address controls."""
    kv, replay, dp, mode = _parse(row["kv_endpoint"]), _parse(row["replay_endpoint"]), row["dp_size"], row["load_publish_endpoint"]
    wild = ("*", "0.0.0.0", "::")
    if mode == "off" or row["kv_endpoint"] is None:
        return None
    if mode in (None, "auto"):
        if kv is None or kv[0] not in wild:
            return None
        host, base = kv[0], kv[1] + dp
        if replay and base < replay[1] + dp and replay[1] < base + dp:
            return None
    else:
        target = _parse(mode)
        if kv is None or target is None or target[0] not in wild:
            return None
        host, base = target
        if any(p and base < p[1] + dp and p[1] < base + dp for p in (kv, replay)):
            return None
    return None if base + dp - 1 > 65535 else {"host": host, "base": base}


if __name__ == "__main__":
    print(json.dumps([r | {"expect_a": generation_a_rule(r)} for r in rows()], indent=0))
