"""`loadlink watch` against a running engine (numbers change) and against one without a load range
(it says why and exits instead of hanging)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request

from cli_helpers import BIN, free_port, free_port_block


def start_engine(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([BIN, "engine", "--port", str(port), "--duration", "60", "--max-running-requests", "4", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return p, url
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("engine did not start")


def test_watch_shows_changing_numbers():
    kv = free_port_block(2)  # the KV port, then the load range after it
    p, url = start_engine("--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}))
    try:
        def load() -> None:
            body = json.dumps({"prompt": "x", "max_tokens": 300}).encode()
            for _ in range(10):
                threading.Thread(target=lambda: urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=body), timeout=60).read(), daemon=True).start()
        threading.Timer(1.0, load).start()
        out = subprocess.run([BIN, "watch", url, "--json", "--duration", "4"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(x) for x in out.stdout.splitlines()]
        assert len(lines) >= 10
        waiting = {x["load"]["num_waiting_reqs"] for x in lines}
        running = {x["load"]["num_running_reqs"] for x in lines}
        assert 0 in running and 4 in running and max(waiting) >= 5, (running, waiting)
        seqs = [x["seq"] for x in lines]
        assert seqs == sorted(seqs)
    finally:
        p.kill()


def test_watch_explains_an_engine_without_a_load_range():
    # A concrete-host KV endpoint: the range is declined with a reason the engine reports.
    p, url = start_engine("--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}"}))
    try:
        out = subprocess.run([BIN, "watch", url], capture_output=True, text=True, timeout=20)
        assert out.returncode != 0
        assert "does not report load" in out.stderr and "wildcard" in out.stderr, out.stderr
    finally:
        p.kill()


def test_watch_router_shows_each_dp_rank_and_what_was_routed_to_it():
    kv = free_port_block(4)  # two KV ports, then the two-rank load range
    p, url = start_engine("--dp-size", "2", "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}))
    rport = free_port()
    r = subprocess.Popen([BIN, "route", "--port", str(rport), "--worker-urls", url, "--duration", "60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    router = f"http://127.0.0.1:{rport}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                w = json.loads(urllib.request.urlopen(router + "/workers", timeout=1).read())["workers"][0]
                if w["source"] == "engine":
                    break
            except (OSError, IndexError, KeyError):
                pass
            time.sleep(0.1)
        for i in range(4):
            body = json.dumps({"prompt": f"session {i} " * 50, "max_tokens": 1}).encode()
            urllib.request.urlopen(urllib.request.Request(router + "/v1/completions", data=body,
                                                          headers={"Content-Type": "application/json"}), timeout=30).read()
        out = subprocess.run([BIN, "watch", "--router", router, "--duration", "1"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert any(url in x and "per-rank" in x for x in lines), out.stdout
        ranks = [x.split() for x in lines if x.strip().startswith("rank ")]
        assert [x[1] for x in ranks[:2]] == ["0", "1"], out.stdout
        assert sum(int(x[6]) for x in ranks[:2]) == 4, out.stdout  # the routed column
        bad = subprocess.run([BIN, "watch", "--router", "http://127.0.0.1:1", "--duration", "1"], capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and "GET http://127.0.0.1:1/workers" in bad.stderr, bad.stderr
    finally:
        r.kill()
        p.kill()
