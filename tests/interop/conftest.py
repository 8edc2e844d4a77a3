"""Shared helpers: the loadlink binary under test and a JSON-lines bridge to it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO = HERE.parent.parent


def loadlink_bin() -> str:
    path = os.environ.get("LOADLINK_BIN") or str(REPO / "target" / "debug" / "loadlink")
    if not os.path.exists(path):
        pytest.fail(f"loadlink binary not found at {path}; build it (cargo build -p loadlink) or set LOADLINK_BIN")
    return path


def run_lines(args: list[str], lines: list[str], timeout: float = 60) -> list[str]:
    """Feeds lines to `loadlink ARGS` on stdin and returns its stdout lines."""
    proc = subprocess.run(
        [loadlink_bin(), *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"loadlink {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout.splitlines()


def run_json(args: list[str], items: list[dict]) -> list[str]:
    return run_lines(args, [json.dumps(i) for i in items])


@pytest.fixture
def procs():
    """Processes a test starts (`live.Procs`); each is killed when the test ends, pass or fail."""
    from live import Procs

    p = Procs()
    try:
        yield p
    finally:
        p.kill_all()
