"""What every CLI test needs: the `loadlink` binary under test (`LOADLINK_BIN`, else the debug
build) and a free loopback port. One module, imported by name (`from cli_helpers import ...`),
rather than a `conftest.py`: `tests/interop` has its own conftest, and `import conftest` would
pick whichever came first on `sys.path` when both suites run in one session."""

from __future__ import annotations

import glob
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("LOADLINK_BIN") or str(REPO / "target" / "debug" / "loadlink")


_HANDED_OUT: set[int] = set()


def free_port_block(n: int) -> int:
    """The first of `n` consecutive ports that are all free now (each checked by binding it on
    every interface) and that this process has not handed out before. An engine binds its KV port
    and the load range after it, so checking only the first port is not enough: under load, a port
    above it can be another process's ephemeral port."""
    for _ in range(500):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        block = range(base, base + n)
        if base + n > 65535 or any(p in _HANDED_OUT for p in block):
            continue
        try:
            for p in block:
                with socket.socket() as t:
                    t.bind(("0.0.0.0", p))
        except OSError:
            continue
        _HANDED_OUT.update(block)
        return base
    raise RuntimeError(f"no block of {n} free ports found")


def free_port() -> int:
    """A free port not handed out before in this process."""
    return free_port_block(1)


def wait_http(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url}")


def start_engine() -> tuple[subprocess.Popen, int]:
    port = free_port()
    p = subprocess.Popen([BIN, "engine", "--port", str(port), "--duration", "120"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/health", p, "engine")
    return p, port


def slot_files(engine_port: int, pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/sglang_loads_loadlink-engine-{engine_port}-{pid}_*.shm")
