"""Stopping a build promptly on SIGINT/SIGTERM.

py-rattler-build holds the GIL for the whole build, so a Python signal handler runs only when the
build returns: a SIGTERM (Slurm preemption, `kill`) waited for the compilers to finish (35 s and
more), and the compilers killed by hand read as a failed or out-of-memory build. Here the C-level
part of Python's signal handling does the work: it writes the signal's number to a wakeup fd at
once, GIL or not, and a small watchdog process reading that fd stops every descendant of the
build (bash, pip, ninja, nvcc: SIGTERM, then SIGKILL after a grace period). The build then fails
quickly, and `stop_requested()` tells the caller to say "stopped", not diagnose a failure.

Public API: stoppable() (a context manager yielding a Stop); Stop.engine() around the rattler-build
call, Stop.check() raises the 'stopped' error (exit 128 + the signal's number).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ExtforgeError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 5.0

# Runs in its own interpreter (`python -I -c`): argv = parent pid, read fd, grace seconds.
WATCHDOG = r"""
import os, signal, sys, time
parent, fd, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if not os.read(fd, 16):
    sys.exit(0)  # the build ended without a signal: the parent closed the pipe

def descendants():
    kids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    found, todo = [], [parent]
    while todo:
        for kid in kids.get(todo.pop(), []):
            if kid != os.getpid():
                found.append(kid)
                todo.append(kid)
    return found

deadline = time.monotonic() + grace
sig = signal.SIGTERM
while True:
    victims = descendants()
    if not victims:
        break
    if time.monotonic() > deadline:
        sig = signal.SIGKILL
    for pid in victims:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(0.2)
"""


@dataclass
class Stop:
    signal: int | None = None
    # While rattler-build runs, a signal is only noted (the watchdog stops the build); raised
    # inside its callbacks it would reach Rust. Elsewhere it stops the command at once.
    in_engine: bool = False

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    @contextlib.contextmanager
    def engine(self) -> Iterator[None]:
        self.in_engine = True
        try:
            yield
        finally:
            self.in_engine = False
        self.check()

    def check(self) -> None:
        """Raise the 'stopped' error if a stop signal came."""
        if self.signal:
            raise ExtforgeError(
                f"build stopped by {self.name}",
                "a stop signal came while building; the compilers and the rest of the build were stopped with it",
                "nothing was added to the output channel; run the same command again to build",
                exit_code=128 + self.signal,
            )


@contextlib.contextmanager
def stoppable(grace: float = GRACE_SECONDS) -> Iterator[Stop]:
    """While the body runs, SIGINT/SIGTERM stop every process it started, at once; the yielded
    Stop names the signal once the body returns. Outside the main thread (signals cannot be
    caught there) the body runs as it is."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def note(signum: int, _frame: object) -> None:
        stop.signal = signum
        if not stop.in_engine:
            stop.check()

    previous = {s: signal.signal(s, note) for s in STOP_SIGNALS}
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watchdog = subprocess.Popen([sys.executable, "-I", "-c", WATCHDOG, str(os.getpid()), str(read_fd), str(grace)],
                                pass_fds=(read_fd,), stdin=subprocess.DEVNULL)
    os.close(read_fd)
    try:
        yield stop
    finally:
        signal.set_wakeup_fd(previous_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(write_fd)
        watchdog.wait()
