"""`/dev/shm` does not fill with slot files (16 KiB per rank each): an engine that is SIGKILLed
leaves its file behind (nothing runs after SIGKILL), and the next engine to start removes every
loadlink engine slot file whose owner PID is gone. Only the files of the PIDs this test started
are counted, so engines of tests running in parallel do not matter."""

from __future__ import annotations

import signal

from cli_helpers import slot_files, start_engine


def test_an_engine_start_removes_the_slot_files_of_sigkilled_engines():
    started = []  # (port, pid) of every engine this test started
    dead = None
    for _ in range(3):
        p, port = start_engine()
        started.append((port, p.pid))
        assert len(slot_files(port, p.pid)) == 1, "the engine creates its slot file"
        if dead is not None:
            assert slot_files(*dead) == [], "the (re)started engine removed the dead one's file"
        p.kill()
        p.wait()
        assert len(slot_files(port, p.pid)) == 1, "SIGKILL leaves the slot file behind"
        dead = (port, p.pid)

    last, port = start_engine()
    started.append((port, last.pid))
    try:
        assert slot_files(*dead) == []
    finally:
        last.send_signal(signal.SIGTERM)
        last.wait(timeout=30)
    left = sum(len(slot_files(port_, pid)) for port_, pid in started)
    assert left == 0, "none of this test's engines left a slot file"
