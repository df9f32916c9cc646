"""Cross-process exclusive locks on shared folders (channels, caches, prefixes).

fcntl.lockf takes POSIX record locks, which NFS forwards to the server: two build nodes
publishing to one NFS channel, or filling one shared cache, serialise on the same lock.
Lock files are opened by safe_files.open_lock: never through a planted symlink, and
group-writable, so every member of a shared folder's group can take the same lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .safe_files import make_dirs, naming, open_lock, remove, same_file


class Busy(Exception):
    """The lock is held by another process; holder is what it wrote into the lock file."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@contextmanager
def exclusive(lock_file: Path, *, transient: bool = False) -> Iterator[None]:
    """Hold lock_file, waiting for other holders. transient: remove it on release, so nothing is
    left beside what it guards (a workspace under version control)."""
    make_dirs(lock_file.parent)
    if not transient:
        fd = open_lock(lock_file)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
        return
    fd = _take_transient(lock_file, fcntl.LOCK_EX)
    try:
        yield
    finally:
        remove(lock_file)
        os.close(fd)


def _take_transient(lock_file: Path, how: int) -> int:
    """Lock a lock file that its holder removes on release: a process that opened it just before
    the removal finds, once it holds the lock, that the name now points elsewhere (or nowhere)
    and tries again on the new file. Busy when `how` does not wait and another process holds it."""
    while True:
        fd = open_lock(lock_file)
        try:
            fcntl.lockf(fd, how)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise Busy(holder) from None
            raise
        if same_file(fd, lock_file):
            return fd
        os.close(fd)


@contextmanager
def exclusive_or_busy(lock_file: Path) -> Iterator[None]:
    """Hold lock_file without waiting (raise Busy naming the holder's pid), and remove it after,
    so nothing is left beside what it guards."""
    fd = _take_transient(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with naming(lock_file):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        remove(lock_file)
        os.close(fd)
