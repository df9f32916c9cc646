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
# A file whose ctime is this close to the moment it was looked at may have changed again within
# the same timestamp tick, unseen: a record of it taken then is not believed. Filesystems that
# keep sub-second times tick within milliseconds (the kernel's coarse clock); only those that
# keep whole seconds (some NFS servers) need seconds. A window of seconds on a fine filesystem
# made the first verify after an install (whose links are made in its last second) trust
# nothing, and the one after it re-hash everything again.
RACY_NS = 3 * 10**9
RACY_FINE_NS = 100 * 10**6
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


def file_key(st: os.stat_result) -> list[int]:
    """What a record of a file's bytes is bound to: size, mtime, ctime, inode, mode and device.
    A write, chmod, chown, rename or link moves the ctime, which no user can set back."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode, st.st_dev]


def stable_key(st: os.stat_result) -> list[int]:
    """file_key, the ctime left out (0) for a file of this user's that nobody else may write:
    every hard link made to it (an install's store, a channel's copy) moves its ctime, and only its
    owner or root could keep its mtime through an edit."""
    key = file_key(st)
    if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        key[2] = 0
    return key


def memo_key(st: os.stat_result, taken_ns: int) -> list[int] | None:
    """The stable_key a record of the file's bytes, read from `taken_ns` on, may be bound to; None
    where its ctime falls within the timestamp tick of the read: a write in that tick would
    leave the key as it was."""
    key = stable_key(st)
    window = RACY_FINE_NS if st.st_ctime_ns % 10**9 else RACY_NS
    return key if key[2] == 0 or st.st_ctime_ns < taken_ns - window else None


def default_threads() -> int:
    return max(2, min(32, 2 * len(os.sched_getaffinity(0))))


# Files hashed by one task of the pool: a torch env's 25,000 files as as many tasks spent more
# time handing out tasks and collecting results than hashing its small files.
BATCH_BYTES = 16 * 1024 * 1024
BATCH_FILES = 256


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

    def batch(files: list[Path]) -> list[tuple[Path, str | OSError]]:
        return [one(p) for p in files]

    with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
        return {p: got for done in pool.map(batch, _batches(paths)) for p, got in done}


def _batches(paths: Iterable[Path]) -> list[list[Path]]:
    """Biggest first, so one huge library is not the last thing a single thread starts on; a
    big file is a batch of its own, small ones are grouped up to BATCH_BYTES or BATCH_FILES."""
    sized = []
    for p in paths:
        try:
            sized.append((os.stat(p).st_size, p))
        except OSError:
            sized.append((0, p))  # hashed all the same: its error is its result
    sized.sort(key=lambda item: -item[0])
    out: list[list[Path]] = []
    size = 0
    for n, p in sized:
        if not out or size + n > BATCH_BYTES or len(out[-1]) >= BATCH_FILES:
            out.append([])
            size = 0
        out[-1].append(p)
        size += n
    return out


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
