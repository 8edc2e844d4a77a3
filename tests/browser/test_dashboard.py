"""The router's /dashboard in a real headless Chromium (driven over the WebDriver protocol by
Debian's chromedriver; no Python browser library needed). It must show every worker with its load
source, and its numbers must change when load changes. A screenshot is kept in artifacts/."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("LOADLINK_BIN") or str(REPO / "target" / "debug" / "loadlink")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import free_port, free_port_block  # noqa: E402  (one port allocator for both suites)


def http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


class WebDriver:
    """The few WebDriver commands this test needs."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        wait_http(self.base + "/status")
        self.profile = tempfile.mkdtemp()
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={self.profile}", "--window-size=1200,500"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}
        self.session = http("POST", self.base + "/session", caps)["value"]["sessionId"]

    def cmd(self, method: str, path: str, body: dict | None = None):
        return http(method, f"{self.base}/session/{self.session}{path}", body)["value"]

    def close(self) -> None:
        try:
            http("DELETE", f"{self.base}/session/{self.session}")
        finally:
            self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture
def fleet():
    procs = []

    def spawn(*args: str) -> None:
        procs.append(subprocess.Popen([BIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    engines = []
    for _ in range(2):
        port, kv = free_port(), free_port_block(2)  # the KV port, then the load range after it
        spawn("engine", "--port", str(port), "--max-running-requests", "4", "--time-scale", "2",
              "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}), "--duration", "120")
        engines.append(f"http://127.0.0.1:{port}")
    for e in engines:
        wait_http(e + "/health")
    rport = free_port()
    spawn("route", "--port", str(rport), "--worker-urls", *engines, "--duration", "120")
    router = f"http://127.0.0.1:{rport}"
    wait_http(router + "/health")
    yield router, engines
    for p in procs:
        p.kill()
        p.wait()


def rows(d: WebDriver) -> dict:
    script = """return Array.from(document.querySelectorAll('#rows tr')).map(tr => ({
        worker: tr.dataset.worker, source: tr.querySelector('td.engine, td.fallback').textContent,
        model: tr.querySelector('.model').textContent,
        waiting: +tr.querySelector('.waiting').textContent, running: +tr.querySelector('.running').textContent,
        blocks: tr.querySelector('.blocks').textContent, hit: tr.querySelector('.hit').textContent}));"""
    return {r["worker"]: r for r in d.cmd("POST", "/execute/sync", {"script": script, "args": []})}


def poll(d: WebDriver, cond, what: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = rows(d)
        if cond(r):
            return r
        time.sleep(0.2)
    raise AssertionError(f"dashboard never showed {what}; last: {rows(d)}")


@pytest.mark.skipif(not os.path.exists(CHROMEDRIVER), reason="chromedriver not installed (scripts/test installs it)")
def test_dashboard_shows_every_worker_and_live_numbers(fleet):
    router, engines = fleet
    d = WebDriver()
    try:
        d.cmd("POST", "/url", {"url": router + "/dashboard"})
        poll(d, lambda r: set(r) == set(engines) and all(x["source"] == "engine" for x in r.values()), "both workers on engine load")
        # Each worker's row names the model it serves (the engines' default served name).
        assert all(x["model"] == "loadlink-sim" for x in rows(d).values()), rows(d)
        # Load the first engine directly: its running and waiting counts must rise on the page.
        def direct() -> None:
            try:
                http("POST", engines[0] + "/v1/completions", {"prompt": "x", "max_tokens": 400}, timeout=120)
            except OSError:
                pass  # the engine is stopped at teardown

        for _ in range(12):
            threading.Thread(target=direct, daemon=True).start()
        busy = poll(d, lambda r: r[engines[0]]["running"] == 4 and r[engines[0]]["waiting"] >= 4, "the direct load")
        assert busy[engines[1]]["running"] == 0
        # A prompt sent twice through the router: the engine's KV events fill its cached-blocks
        # cell, and the second request's believed hit fills the hit-rate cell.
        long_prompt = "cache me " * 200
        for _ in range(2):
            http("POST", router + "/v1/completions", {"prompt": long_prompt, "max_tokens": 1}, timeout=60)
        poll(d, lambda r: any(x["blocks"] not in ("–", "0") and x["hit"].endswith("%") for x in r.values()),
             "cached blocks and a hit rate")
        shot = base64.b64decode(d.cmd("GET", "/screenshot"))
        out = REPO / "artifacts"
        out.mkdir(exist_ok=True)
        (out / "dashboard.png").write_bytes(shot)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        d.close()


@pytest.fixture
def ranked_fleet():
    """One engine of two DP ranks (each publishing its load and KV events) behind a router."""
    procs = []
    port, kv = free_port(), free_port_block(4)  # two KV ports, then the two-rank load range
    procs.append(subprocess.Popen([BIN, "engine", "--port", str(port), "--dp-size", "2", "--time-scale", "2",
                                   "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}),
                                   "--duration", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    engine = f"http://127.0.0.1:{port}"
    wait_http(engine + "/health")
    rport = free_port()
    procs.append(subprocess.Popen([BIN, "route", "--port", str(rport), "--worker-urls", engine, "--duration", "120"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    router = f"http://127.0.0.1:{rport}"
    wait_http(router + "/health")
    yield router, engine
    for p in procs:
        p.kill()
        p.wait()


def rank_rows(d: WebDriver) -> list:
    script = """return Array.from(document.querySelectorAll('#rows tr.rank')).map(tr => ({
        worker: tr.dataset.worker, rank: tr.dataset.rank, label: tr.children[0].textContent,
        source: tr.children[6].textContent, blocks: tr.querySelector('.blocks').textContent}));"""
    return d.cmd("POST", "/execute/sync", {"script": script, "args": []})


@pytest.mark.skipif(not os.path.exists(CHROMEDRIVER), reason="chromedriver not installed (scripts/test installs it)")
def test_dashboard_shows_each_dp_rank_with_what_was_routed_to_it(ranked_fleet):
    router, engine = ranked_fleet
    d = WebDriver()
    try:
        d.cmd("POST", "/url", {"url": router + "/dashboard"})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = rank_rows(d)
            if len(r) == 2 and all(x["source"] == "engine" for x in r):
                break
            time.sleep(0.2)
        assert [x["rank"] for x in r] == ["0", "1"] and all(x["worker"] == engine for x in r), r
        for i in range(6):
            http("POST", router + "/v1/completions", {"prompt": f"session {i} " * 100, "max_tokens": 1}, timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = rank_rows(d)
            routed = [int(x["label"].rsplit(" ", 1)[1]) for x in r if "routed" in x["label"]]
            if sum(routed) == 6 and any(x["blocks"] not in ("–", "0") for x in r):
                break
            time.sleep(0.2)
        assert sum(routed) == 6, r
        assert any(x["blocks"] not in ("–", "0") for x in r), r
    finally:
        d.close()
