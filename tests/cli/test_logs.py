"""Logs fit for a log shipper: no ANSI escapes when stderr is not a terminal, and `--log-format json`
writes one JSON object per line."""

from __future__ import annotations

import json
import os
import subprocess

from cli_helpers import BIN, free_port


def engine_stderr(*flags: str, env: dict[str, str] | None = None) -> str:
    """A short engine run (it logs its listening address at info), stderr captured through a pipe."""
    out = subprocess.run([BIN, *flags, "engine", "--port", str(free_port()), "--duration", "0.5"],
                         capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_text_logs_to_a_pipe_carry_no_colour_codes():
    err = engine_stderr()
    assert "engine on http://" in err, err
    assert "\x1b[" not in err, repr(err)


def test_json_logs_are_one_object_per_line():
    err = engine_stderr("--log-format", "json")
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records, err
    assert all({"timestamp", "level", "fields"} <= r.keys() for r in records), records
    assert any("engine on http://" in r["fields"].get("message", "") for r in records), records
    assert "\x1b[" not in err


def test_rust_log_filters_levels():
    err = engine_stderr(env={"RUST_LOG": "error"})
    assert "engine on http://" not in err, err
