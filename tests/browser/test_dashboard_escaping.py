"""The dashboard shows what workers send as text, never as markup. A fake worker (a real HTTP
server on loopback) declines its load range with a reason full of markup; the router shows that
reason on /dashboard. In headless Chromium the reason must be in the cell's title as literal text,
no element from it may exist, and its script must not have run."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_dashboard import BIN, CHROMEDRIVER, WebDriver, free_port, wait_http

# Breaks out of a double-quoted attribute, adds an element, and runs script if parsed as HTML.
MARKUP = '"><img id="injected-img" src="x" onerror="window.__pwned = 1"><b id="injected-b">bold</b>'


def fake_worker() -> tuple[ThreadingHTTPServer, str]:
    """A worker whose /server_info advertises KV events but declines its load range with
    MARKUP as the reason; it answers /health and nothing else."""
    info = {
        "dp_size": 1,
        "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": free_port(),
                      "topic": "", "block_size": 16, "dp_size": 1},
        "load_publish_decline_reason": MARKUP,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/server_info":
                body, status, kind = json.dumps(info).encode(), 200, "application/json"
            elif self.path == "/health":
                body, status, kind = b"ok", 200, "text/plain"
            else:
                body, status, kind = b"not found", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.skipif(not os.path.exists(CHROMEDRIVER), reason="chromedriver not installed (scripts/test installs it)")
def test_markup_in_a_worker_decline_reason_shows_as_text():
    server, worker = fake_worker()
    rport = free_port()
    router = subprocess.Popen([BIN, "route", "--port", str(rport), "--worker-urls", worker, "--duration", "120"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = None
    try:
        base = f"http://127.0.0.1:{rport}"
        wait_http(base + "/health")
        d = WebDriver()
        d.cmd("POST", "/url", {"url": base + "/dashboard"})
        probe = """const tr = document.querySelector('#rows tr');
            return tr && {worker: tr.dataset.worker, title: tr.querySelector('td.engine, td.fallback').title,
                injected: document.querySelectorAll('#injected-img, #injected-b, #rows img, #rows b').length,
                pwned: window.__pwned === undefined ? null : window.__pwned};"""
        deadline = time.monotonic() + 20
        seen = None
        while time.monotonic() < deadline:
            seen = d.cmd("POST", "/execute/sync", {"script": probe, "args": []})
            if seen and MARKUP in seen["title"]:
                break
            if seen and seen["injected"]:
                break
            time.sleep(0.2)
        assert seen, "the dashboard never showed the worker"
        assert seen["worker"] == worker
        assert seen["injected"] == 0, f"markup from the worker became elements: {seen}"
        assert seen["pwned"] is None, "script from the worker ran in the page"
        assert MARKUP in seen["title"], f"the reason is shown as literal text: {seen}"
    finally:
        if d is not None:
            d.close()
        router.kill()
        router.wait()
        server.shutdown()
