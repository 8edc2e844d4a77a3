"""What every CLI test needs: the `loadlink` binary under test (`LOADLINK_BIN`, else the debug
build) and a free loopback port. One module, imported by name (`from cli_helpers import ...`),
rather than a `conftest.py`: `tests/interop` has its own conftest, and `import conftest` would
pick whichever came first on `sys.path` when both suites run in one session."""

from __future__ import annotations

import os
import pathlib
import socket

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("LOADLINK_BIN") or str(REPO / "target" / "debug" / "loadlink")


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (free now; nothing reserves it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
