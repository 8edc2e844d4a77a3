"""The drain flags of `loadlink route` and `loadlink engine`. An impossible `--drain-timeout` or
`--drain-delay` (`inf`, `1e300`, a negative number; by flag or by environment variable) fails at
start naming the flag, instead of being accepted and panicking at shutdown. After SIGTERM the
router keeps serving for `--drain-delay` with `/readiness` at 503, so a load balancer can take it
out of rotation before the listener closes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from cli_helpers import BIN, free_port, start_engine, wait_http


def exits_at_start(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `loadlink ARGS`; a process still running after 20 s accepted its flags and is
    stopped (SIGKILL: a SIGTERM would run the very drain under test)."""
    p = subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"loadlink {' '.join(args)} {env or ''} started instead of refusing the value")
    return subprocess.CompletedProcess(args, p.returncode, out, err)


@pytest.mark.parametrize("command", ["route", "engine"])
@pytest.mark.parametrize("value", ["inf", "1e300", "-1", "nan"])
def test_an_impossible_drain_timeout_is_refused_at_start(command, value):
    base = [command, "--port", "0"]
    r = exits_at_start([*base, f"--drain-timeout={value}"])
    assert r.returncode != 0
    assert "--drain-timeout" in r.stderr and "between 0 and 86400" in r.stderr, r.stderr
    r = exits_at_start(base, env={"LOADLINK_DRAIN_TIMEOUT": value})
    assert r.returncode != 0
    assert "--drain-timeout" in r.stderr, r.stderr
    r = exits_at_start([*base, f"--drain-delay={value}"])
    assert r.returncode != 0
    assert "--drain-delay" in r.stderr, r.stderr


def test_an_impossible_drain_timeout_in_the_config_file_is_refused_at_start(tmp_path):
    cfg = tmp_path / "router.json"
    cfg.write_text('{"drain_timeout": 1e300}')
    r = exits_at_start(["route", "--port", "0", "--config", str(cfg)])
    assert r.returncode != 0
    assert "--drain-timeout" in r.stderr, r.stderr


def status(url: str) -> int | None:
    """The status of GET `url` on a new connection; None when the connection is refused."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return None


def test_router_keeps_serving_with_readiness_503_for_the_drain_delay_after_sigterm():
    engine, eport = start_engine()
    rport = free_port()
    router = subprocess.Popen(
        [BIN, "route", "--port", str(rport), "--worker-urls", f"http://127.0.0.1:{eport}",
         "--drain-delay", "30", "--drain-timeout", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{rport}"
    try:
        wait_http(f"{base}/readiness", router, "router")
        router.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while status(f"{base}/readiness") != 503:
            assert time.monotonic() < deadline, "/readiness never answered 503 after SIGTERM"
            time.sleep(0.05)
        # New connections are still accepted and served: the load balancer has time to react.
        assert status(f"{base}/health") == 200
        assert status(f"{base}/v1/models") == 200
        assert router.poll() is None, "the router waits out its drain delay"
    finally:
        for p in (router, engine):
            if p.poll() is None:
                p.kill()
                p.wait()
