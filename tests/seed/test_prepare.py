"""The seed rows' background work takes only the CPU the tests leave: niced, and in the tests'
own session (the kernel shares CPU between sessions first), stopped as one group."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from . import prepare


def test_the_background_is_niced_in_this_session_and_stops_with_its_children(tmp_path: Path):
    with (tmp_path / "log").open("w") as log:
        proc = prepare.background(["sh", "-c", "sleep 60 & wait"], log, dict(os.environ))
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 19
        # A new session would be an autogroup of its own, weighing as much as the tests.
        assert os.getsid(proc.pid) == os.getsid(0) and os.getpgid(proc.pid) == proc.pid
        # Empty where this process is in the kernel's default autogroup (a tree no one started
        # a session in, as in some containers): the background must then be there too.
        own = Path("/proc/self/autogroup")
        if own.exists():
            assert Path(f"/proc/{proc.pid}/autogroup").read_text() == own.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # the sleep, a child, is in the group until it ends
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a child of the background outlived its stop")
