"""Cross-process exclusive locks on shared folders (channels, caches, prefixes).

fcntl.lockf takes POSIX record locks, which NFS forwards to the server: two build nodes
publishing to one NFS channel, or filling one shared cache, serialise on the same lock.
Lock files are opened by safe_files.open_lock: never through a planted symlink, and
group-writable, so every member of a shared folder's group can take the same lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .safe_files import open_lock, same_file


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock(lock_file)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class Busy(Exception):
    """The lock is held by another process; holder is what it wrote into the lock file."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@contextmanager
def exclusive_or_busy(lock_file: Path) -> Iterator[None]:
    """Hold lock_file without waiting (raise Busy naming the holder's pid), and remove it after.

    The file is removed on release so nothing is left beside what it guards; a process that
    opened it just before the removal finds, once it holds the lock, that the name now points
    elsewhere (or nowhere) and tries again on the new file.
    """
    while True:
        fd = open_lock(lock_file)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise Busy(holder) from None
        if same_file(fd, lock_file):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.unlink(lock_file)
        os.close(fd)
