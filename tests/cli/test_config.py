"""`loadlink route --config FILE` is read through the same definitions as the flags: the keys the
file always had (worker_urls, policy, load_signal, host, port, freshness_ms, max_retries,
admin_token) still work, every other flag (a budget, the drain delay) is a key too, its values
override the flags, and an unknown key or a wrong type fails at start naming the key."""

from __future__ import annotations

import json
import subprocess
import urllib.request

from cli_helpers import BIN, free_port, start_engine, wait_http


def test_config_file_keys_are_the_flag_names(tmp_path):
    engine, eport = start_engine()
    rport = free_port()
    cfg = tmp_path / "router.json"
    cfg.write_text(json.dumps({
        "worker_urls": [f"http://127.0.0.1:{eport}"], "policy": "round_robin", "load_signal": "inflight",
        "host": "127.0.0.1", "port": rport, "freshness_ms": 2000, "max_retries": 1, "admin_token": "t",
        "max_ranks": 8, "drain_delay": 0, "trust_advertised_hosts": False,
    }))
    # The file's policy wins over the flag's.
    router = subprocess.Popen([BIN, "route", "--policy", "random", "--config", str(cfg)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{rport}/readiness", router, "router")
        with urllib.request.urlopen(f"http://127.0.0.1:{rport}/workers", timeout=5) as r:
            workers = json.load(r)
        assert workers["policy"] == "round_robin", workers
        assert [w["url"] for w in workers["workers"]] == [f"http://127.0.0.1:{eport}"]
    finally:
        for p in (router, engine):
            p.kill()
            p.wait()


def test_unknown_keys_and_wrong_types_name_the_key(tmp_path):
    for body, expected in [({"max_rank": 8}, '"max_rank"'), ({"max_ranks": "many"}, "max_ranks"),
                           ({"policy": "fastest"}, "--policy")]:
        cfg = tmp_path / "router.json"
        cfg.write_text(json.dumps(body))
        r = subprocess.run([BIN, "route", "--port", "0", "--config", str(cfg)], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode != 0, body
        assert expected in r.stderr, (body, r.stderr)
