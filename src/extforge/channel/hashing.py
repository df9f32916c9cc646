"""sha256 of files, fast: large reads into one buffer (hashlib releases the GIL on them),
many files hashed on a thread pool."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

CHUNK = 4 * 1024 * 1024
_local = threading.local()


def _buffer() -> bytearray:
    # One buffer per thread: allocating (and zeroing) 4 MiB per file dominated small files.
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(CHUNK)
    return buf


def sha256_file(path: Path | str, *, copy_to: BinaryIO | None = None) -> str:
    """Hex sha256 of a file; when copy_to (a binary file object) is given, the bytes are written
    to it too, so a copy and its hash come from the same read."""
    return digest_file(path, "sha256", copy_to=copy_to)


def digest_file(path: Path | str, algorithm: str, *, copy_to: BinaryIO | None = None) -> str:
    return digests_file(path, (algorithm,), copy_to=copy_to)[algorithm]


def digests_file(path: Path | str, algorithms: Sequence[str], *, copy_to: BinaryIO | None = None) -> dict[str, str]:
    """Several digests of a file from one read ({algorithm: hex}): a package checked against both
    the lock's sha256 and its md5 is read once, and both digests are of the same bytes."""
    hashes = [hashlib.new(a) for a in algorithms]
    buf = _buffer()
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            for h in hashes:
                h.update(view[:n])
            if copy_to is not None:
                copy_to.write(view[:n])
    return {a: h.hexdigest() for a, h in zip(algorithms, hashes, strict=True)}


def default_threads() -> int:
    return max(2, min(32, 2 * len(os.sched_getaffinity(0))))


def hash_many(
    paths: Iterable[Path], *, threads: int | None = None, on_done: Callable[[], None] | None = None
) -> dict[Path, str | OSError]:
    """sha256 of every path; an unreadable file maps to its OSError instead of stopping the rest."""

    def one(p: Path) -> tuple[Path, str | OSError]:
        try:
            return p, sha256_file(p)
        except OSError as exc:
            return p, exc
        finally:
            if on_done:
                on_done()

    # Biggest first so one huge library is not the last thing a single thread starts on.
    ordered = sorted(paths, key=lambda p: -(p.stat().st_size if p.is_file() else 0))
    with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
        return dict(pool.map(one, ordered))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
