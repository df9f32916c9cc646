"""Cross-process exclusive locks on shared folders (channels, caches).

fcntl.lockf takes POSIX record locks, which NFS forwards to the server: two build nodes
publishing to one NFS channel, or filling one shared cache, serialise on the same lock.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(fh, fcntl.LOCK_UN)
