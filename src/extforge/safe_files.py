"""Writing extforge's own files into folders other people can write (a group channel, a
workspace, an envs tree) without being redirected by what they planted there.

Every name is opened relative to a descriptor of its folder with O_NOFOLLOW, so a symlink
planted under the name of a log, lock or temporary is refused instead of followed (which
would append to, truncate or create its target). Temporaries are created exclusively under
unique names and renamed over the final name: rename replaces a planted symlink itself,
never its target. The folder itself is the caller's and is followed as given.

Modes are set with fchmod on what this process created, so a user's umask 077 cannot make a
shared file unreadable to the group, and a file someone else created keeps its mode.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import ExtforgeError

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# Shared files that every member of the folder's group appends to or locks.
GROUP_WRITABLE = 0o664
READABLE = 0o644


def _refusal(path: Path, why: str) -> ExtforgeError:
    return ExtforgeError(
        f"refusing to write {path}: {why}",
        f"extforge writes its own files only as regular files it opens without following links; "
        f"someone who can write {path.parent} may have put this there",
        f"check who made {path}, remove it and run again",
    )


@contextmanager
def folder(path: Path) -> Iterator[int]:
    """A descriptor of the folder `path` (following the path as the caller gave it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_regular(path: Path, dir_fd: int, flags: int, mode: int) -> tuple[int, bool]:
    """Open path.name in dir_fd without following a symlink; a non-regular file is refused.

    Returns the descriptor and whether this call created the file. O_NONBLOCK keeps a FIFO
    planted under the name from blocking the open; it is cleared again for regular files.
    """
    while True:
        try:
            try:
                fd = os.open(path.name, flags | NOFOLLOW | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK, mode, dir_fd=dir_fd)
                created = True
                break
            except FileExistsError:
                created = False
                fd = os.open(path.name, flags | NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
                break
        except FileNotFoundError:
            continue  # removed between the two opens (a lock released): create it again
        except PermissionError:
            raise ExtforgeError(
                f"cannot write {path}",
                "you may not write it or its folder (another user created it with a mode that leaves out your group, "
                "or the folder is not group-writable)",
                f"ask its owner to run `chmod g+w {path}` (docs/site-admin.md: a channel shared by a Unix group), "
                "or remove it while no extforge runs there",
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refusal(path, "it is a symbolic link") from None
            if exc.errno == errno.EISDIR:
                raise _refusal(path, "it is not a regular file") from None
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refusal(path, "it is not a regular file")
    os.set_blocking(fd, True)
    if created:
        os.fchmod(fd, mode)
    return fd, created


def append(path: Path, data: bytes, *, mode: int = GROUP_WRITABLE) -> int:
    """Append data to path (created with `mode` if missing) and fsync it; return the size path
    had before, for truncate() to undo the append.

    A previous writer killed inside its write leaves a last line without its newline: one is
    added before data, so line-oriented readers lose only that torn line.
    """
    with folder(path.parent) as dfd:
        fd, _ = _open_regular(path, dfd, os.O_RDWR | os.O_APPEND, mode)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, (b"\n" if torn else b"") + data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return size


def truncate(path: Path, size: int) -> None:
    """Cut path back to size (undo an append), never through a symlink."""
    with folder(path.parent) as dfd:
        fd, _ = _open_regular(path, dfd, os.O_RDWR, GROUP_WRITABLE)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_name(name: str, prefix: str = "") -> str:
    """A name no other process picks: pid plus random bits (two runs of one pid namespace, or
    two nodes sharing an NFS folder, may share a pid). `prefix` lets a cleaner find them."""
    return f".{prefix}{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"


@contextmanager
def atomic_writer(path: Path, *, mode: int = READABLE, tmp_prefix: str = "") -> Iterator[BinaryIO]:
    """A binary file that becomes path when the block ends without an exception: written under
    an exclusively created temporary name, fsynced, then renamed over path (a symlink planted at
    path is replaced, not followed). On an exception the temporary is removed, path untouched."""
    with folder(path.parent) as dfd:
        tmp = temp_name(path.name, tmp_prefix)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(fd, mode)
                yield out
                out.flush()
                os.fsync(fd)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        os.fsync(dfd)


def write_atomic(path: Path, data: bytes, *, mode: int = READABLE) -> None:
    """Replace path with data: readers see the old file or the new one, never a part."""
    with atomic_writer(path, mode=mode) as out:
        out.write(data)


def open_lock(path: Path, *, mode: int = GROUP_WRITABLE) -> int:
    """A read-write descriptor of the lock file path (created if missing, never through a
    symlink), ready for fcntl.lockf. Group-writable by default: every member of a shared
    folder's group must be able to take the same lock."""
    with folder(path.parent) as dfd:
        fd, _ = _open_regular(path, dfd, os.O_RDWR, mode)
    return fd


def same_file(fd: int, path: Path) -> bool:
    """Whether path (not followed) still names the file open as fd."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def make_dir(path: Path, *, like: Path | None = None) -> None:
    """mkdir path (no error if it is a folder already); the new folder takes the group
    permission bits of `like` (default its parent), so a setgid, group-writable channel stays
    writable by the group whatever the creating user's umask. A symlink at path is refused."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise _refusal(path, "it is not a folder (a symbolic link or a file is in its place)") from None
        return
    template = os.stat(like or path.parent).st_mode
    os.chmod(path, 0o755 | (template & (stat.S_IRWXG | stat.S_ISGID)))
