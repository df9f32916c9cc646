"""Every change extforge makes on disk in folders other people can write (a group channel, a
workspace, an envs tree, a shared cache, a prefix): writes, deletes, mode changes, renames
and reads of its own files, without being redirected by what someone planted there.

tests/test_disk_layer.py fails on a write, delete, chmod or rename anywhere else in src/.

Every name is opened relative to a descriptor of its folder with O_NOFOLLOW, so a symlink
planted under the name of a log, lock or temporary is refused instead of followed (which
would append to, truncate or create its target). Temporaries are created exclusively under
unique names and renamed over the final name: rename replaces a planted symlink itself,
never its target. The folder itself is the caller's and is followed as given, unless the
caller names an anchor (`beneath`): then only the anchor is followed and every folder below
it is opened without following a link, so a planted `logs -> /elsewhere` is refused.

Modes are set with fchmod on what this process created, so a user's umask 077 cannot make a
shared file unreadable to the group, and a file someone else created keeps its mode.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from .errors import ExtforgeError

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# Shared files that every member of the folder's group appends to or locks.
GROUP_WRITABLE = 0o664
READABLE = 0o644


def _refusal(path: Path, why: str, verb: str = "write") -> ExtforgeError:
    return ExtforgeError(
        f"refusing to {verb} {path}: {why}",
        f"extforge writes its own files only as regular files it opens without following links; "
        f"someone who can write {path.parent} may have put this there",
        f"check who made {path}, remove it and run again",
    )


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _open_folder(path: Path, beneath: Path | None) -> int:
    if beneath is None:
        return os.open(path, _DIR)
    rel = path.relative_to(beneath).parts  # ValueError: a path outside its anchor is a bug
    fd = os.open(beneath, _DIR)
    try:
        for i, part in enumerate(rel):
            try:
                child = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(beneath.joinpath(*rel[: i + 1]), "it is a symbolic link or not a folder", "use") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError of a write or fsync names no file: name the one written (a full disk's error
    then says which file system)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno in _STORAGE_ERRORS:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise  # a network error of what the caller streams in, or one that names its file already


@contextmanager
def folder(path: Path, *, beneath: Path | None = None) -> Iterator[int]:
    """A descriptor of the folder `path`: followed as the caller gave it, or, with an anchor
    `beneath`, with no symbolic link followed below the anchor."""
    fd = _open_folder(path, beneath)
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


def append(path: Path, data: bytes, *, mode: int = GROUP_WRITABLE, beneath: Path | None = None) -> int:
    """Append data to path (created with `mode` if missing) and fsync it; return the size path
    had before, for truncate() to undo the append.

    A previous writer killed inside its write leaves a last line without its newline: one is
    added before data, so line-oriented readers lose only that torn line.
    """
    with naming(path), folder(path.parent, beneath=beneath) as dfd:
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
def atomic_writer(path: Path, *, mode: int = READABLE, tmp_prefix: str = "",
                  beneath: Path | None = None, sync: bool = True) -> Iterator[BinaryIO]:
    """A binary file that becomes path when the block ends without an exception: written under
    an exclusively created temporary name, fsynced, then renamed over path (a symlink planted at
    path is replaced, not followed). On an exception the temporary is removed, path untouched.
    sync=False: no fsync, for a folder a crash throws away (install's staging folder)."""
    with naming(path), folder(path.parent, beneath=beneath) as dfd:
        tmp = temp_name(path.name, tmp_prefix)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(fd, mode)
                yield out
                out.flush()
                if sync:
                    os.fsync(fd)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        if sync:
            os.fsync(dfd)


def write_atomic(path: Path, data: bytes, *, mode: int = READABLE, beneath: Path | None = None, sync: bool = True) -> None:
    """Replace path with data: readers see the old file or the new one, never a part."""
    with atomic_writer(path, mode=mode, beneath=beneath, sync=sync) as out:
        out.write(data)


def new_text_file(path: Path, *, mode: int = READABLE, beneath: Path | None = None) -> TextIO:
    """The new file path, open for writing text as it grows (a log others may follow): created
    exclusively, never through a link or over anything already at the name (refused)."""
    with folder(path.parent, beneath=beneath) as dfd:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
        except FileExistsError:
            raise _refusal(path, "something is there already (a symbolic link, or another run's file)") from None
    os.fchmod(fd, mode)
    return open(path, "w", opener=lambda _name, _flags: fd)  # its `name` the path, as readers of the log take it


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
    fd = os.open(path, _DIR | os.O_NOFOLLOW)  # never a link swapped in since the mkdir
    try:
        os.fchmod(fd, 0o755 | (template & (stat.S_IRWXG | stat.S_ISGID)))
    finally:
        os.close(fd)


def names(path: Path, *, beneath: Path | None = None) -> list[str]:
    """The names in folder path (with an anchor: no link followed below it)."""
    with folder(path, beneath=beneath) as dfd:
        return os.listdir(dfd)


def make_dirs(path: Path, *, beneath: Path | None = None, mode: int = 0o777) -> None:
    """mkdir -p of path. With an anchor `beneath` (created as given if missing), a link or a
    file in place of any folder below it is refused, never followed; without one the whole
    path is the caller's and followed as given."""
    if beneath is None:
        path.mkdir(mode, parents=True, exist_ok=True)
        return
    beneath.mkdir(parents=True, exist_ok=True)
    fd = os.open(beneath, _DIR)
    try:
        for part in path.relative_to(beneath).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, mode, dir_fd=fd)
            try:
                child = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(path, f"{part} in it is a symbolic link or not a folder", "create") from None
                raise
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def make_private_dir(path: Path, *, beneath: Path | None = None, exist_ok: bool = True, own_group: bool = False,
                     readable: bool = False) -> None:
    """The folder path, mode 0700, made by this user (created if missing; with exist_ok False,
    FileExistsError where anything is there). One that exists is used only if it is a folder
    (not a link) this user owns that nobody else can write: what extforge later trusts in it (a
    lock, a journal of what to delete) is then its own. With `own_group`, a new one takes this
    user's group, not a setgid parent's: files made in it and hard-linked elsewhere (a package
    cache's into an environment) carry the group their user would give them, not the shared
    cache's. With `readable`, mode 0755: others may read it, still nobody else write it."""
    with folder(path.parent, beneath=beneath) as dfd:
        created = False
        try:
            os.mkdir(path.name, 0o755 if readable else 0o700, dir_fd=dfd)
            created = True
        except FileExistsError:
            if not exist_ok:
                raise
        try:
            fd = os.open(path.name, _DIR | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _private_refusal(path, "it is a symbolic link or not a folder") from None
            raise
        try:
            if own_group and created and os.fstat(fd).st_gid != os.getegid():
                os.fchown(fd, -1, os.getegid())
                os.fchmod(fd, 0o700)  # the setgid bit it inherited goes too
            why = not_private_why(os.fstat(fd), readable=readable)
        finally:
            os.close(fd)
        if why:
            raise _private_refusal(path, why)


def not_private_why(st: os.stat_result, *, readable: bool = False) -> str | None:
    """Why a folder (its lstat or fstat) is not private to this user (`readable`: not writable
    by anyone else); None when it is."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is a symbolic link or not a folder"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (0o022 if readable else 0o077):
        return f"its mode is {stat.filemode(st.st_mode)}, not {'drwxr-xr-x' if readable else 'drwx------'}"
    return None


def _private_refusal(path: Path, why: str) -> ExtforgeError:
    return ExtforgeError(
        f"refusing to use {path}: {why}",
        "extforge keeps state there that it acts on (what to delete, what is locked) and trusts it only when "
        "it made the folder itself, private to you; someone who can write its parent may have put this there",
        f"check who made {path}; remove it (`rm -r {path}`) if nothing of yours runs there, and run again",
    )


def _remove_at(dfd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        # shutil's descriptor-based walk: it never follows a link inside the tree either.
        shutil.rmtree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)
    return True


def remove(path: Path, *, beneath: Path | None = None) -> bool:
    """Delete path (a file, a link itself, or a folder with everything in it) without
    following a symbolic link at path, inside it or (with an anchor) above it. Whether
    something was there. Entries that cannot be removed raise OSError."""
    try:
        with folder(path.parent, beneath=beneath) as dfd:
            return _remove_at(dfd, path.name)
    except FileNotFoundError:
        return False


def remove_quietly(path: Path, *, beneath: Path | None = None) -> None:
    """remove() for cleanup on the way out, where what cannot go stays (and is named by
    nothing: the next run's cleanup tries again). A planted link is still never followed."""
    with contextlib.suppress(OSError, ExtforgeError):
        remove(path, beneath=beneath)


def remove_dir(path: Path, *, beneath: Path | None = None) -> bool:
    """rmdir of an empty folder (never a link in its place); whether it went."""
    try:
        with folder(path.parent, beneath=beneath) as dfd:
            os.rmdir(path.name, dir_fd=dfd)
    except (OSError, ExtforgeError):
        return False
    return True


def rename(src: Path, dst: Path, *, beneath: Path | None = None) -> None:
    """Rename src to dst, each name relative to a descriptor of its folder: a link at either
    name is moved or replaced itself, never followed."""
    with folder(src.parent, beneath=beneath) as sfd, folder(dst.parent, beneath=beneath) as dfd:
        os.rename(src.name, dst.name, src_dir_fd=sfd, dst_dir_fd=dfd)


def move_in(src: Path, dest: Path, *, beneath: Path, mode: int = READABLE) -> None:
    """Move the regular file src, in a folder only this user can reach, to dest below `beneath`
    (a folder others may write), mode `mode`, over whatever is at dest (a link planted there is
    replaced, never followed): renamed where both lie on one file system, else copied through an
    exclusively created temporary and renamed into place, then src removed."""
    with folder(src.parent) as sfd:
        fd = _open_to_read(src, sfd)
        try:
            os.fchmod(fd, mode)
            try:
                with folder(dest.parent, beneath=beneath) as dfd:
                    os.rename(src.name, dest.name, src_dir_fd=sfd, dst_dir_fd=dfd)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            with atomic_writer(dest, mode=mode, beneath=beneath) as out, open(fd, "rb", closefd=False) as fin:
                shutil.copyfileobj(fin, out, 4 << 20)
        finally:
            os.close(fd)
        os.unlink(src.name, dir_fd=sfd)


def touch(path: Path, *, beneath: Path | None = None) -> None:
    """Set path's times to now, never a link's target."""
    with folder(path.parent, beneath=beneath) as dfd:
        os.utime(path.name, dir_fd=dfd, follow_symlinks=False)


def set_mode(path: Path, mode: int, *, beneath: Path | None = None) -> bool:
    """chmod path only if it is a regular file this user owns (a link planted there is not
    followed, a FIFO not waited on, another member's file keeps its mode); whether it has that
    mode now. A file that has it already is left alone: a chmod moves its ctime even to the same
    mode, and the channel index takes a moved ctime for a rewritten package (read again, ~3 GB a
    torch row)."""
    with folder(path.parent, beneath=beneath) as dfd:
        try:
            fd = os.open(path.name, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except OSError:
            return False  # a link (ELOOP), gone, or unreadable: not ours to change
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return False
            if stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return True


class Refused(ExtforgeError):
    """A file extforge will not read from a place others may write, and why (`reason`, for a
    caller's own one-line warning)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(
            f"refusing to read {path}: {reason}",
            "it is in a place other users may write, and extforge reads from there only a regular file of "
            "bounded size (and, for its own state, one nobody else may write)",
            f"check who wrote {path}; remove it (extforge writes it again when it needs it) and run again",
        )
        self.path = path
        self.reason = reason


def _open_to_read(path: Path, dfd: int, *, own: bool = False) -> int:
    """A descriptor of the regular file path.name in dfd: no link followed, a FIFO or device
    refused without waiting on it; `own`: this user's file, writable by nobody else."""
    try:
        fd = os.open(path.name, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(path, "it is a symbolic link") from None
        raise
    st = os.fstat(fd)
    why = ("it is not a regular file (a FIFO, a device or a folder)" if not stat.S_ISREG(st.st_mode) else
           f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}), and extforge wrote it as you"
           if own and st.st_uid != os.geteuid() else
           f"its mode is {stat.filemode(st.st_mode)}: others may write it" if own and st.st_mode & 0o022 else "")
    if why:
        os.close(fd)
        raise Refused(path, why)
    os.set_blocking(fd, True)
    return fd


def hard_link(src: Path, dest: Path, *, follow: bool = False) -> None:
    """Link the file src as the new name dest (never over an existing dest). A link at src is
    linked itself unless `follow` (src is then the caller's, as given)."""
    with folder(src.parent) as sfd, folder(dest.parent) as dfd:
        os.link(src.name, dest.name, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=follow)


def _by_folder(entries: Iterable[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """(relative path, value) pairs grouped by the path's folder: {folder: [(name, value)]}."""
    grouped: dict[str, list[tuple[str, str]]] = {}
    for rel, value in entries:
        parent, _, name = rel.rpartition("/")
        grouped.setdefault(parent, []).append((name, value))
    return grouped


def hard_links(src: Path, dest: Path, files: Iterable[str], *, beneath: Path) -> None:
    """hard_link of src/rel as dest/rel for each relative path, dest's folders made as make_dirs
    does (none followed below `beneath`): each folder is opened once, not once per file (an
    interpreter's 2,000 files at every install)."""
    for parent, names in _by_folder((rel, rel) for rel in files).items():
        target = dest / parent if parent else dest
        make_dirs(target, beneath=beneath)
        with folder(src / parent if parent else src) as sfd, folder(target, beneath=beneath) as dfd:
            for name, _ in names:
                os.link(name, name, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)


def symlinks(dest: Path, links: Iterable[tuple[str, str]], *, beneath: Path) -> None:
    """symlink(target, dest/rel) for each (relative path, target), dest's folders made as
    make_dirs does (none followed below `beneath`), each opened once."""
    for parent, names in _by_folder(links).items():
        target = dest / parent if parent else dest
        make_dirs(target, beneath=beneath)
        with folder(target, beneath=beneath) as dfd:
            for name, points_to in names:
                os.symlink(points_to, name, dir_fd=dfd)


def clone(src: Path, dest: Path, *, mode: int = READABLE) -> None:
    """Copy the regular file src to the new file dest. copy_file_range: the kernel clones where
    the filesystem can (btrfs, XFS) and NFS 4.2 copies on the server; a plain copy where
    neither works."""
    with naming(dest), folder(src.parent) as sfd, folder(dest.parent) as dfd:
        fin = _open_to_read(src, sfd)
        try:
            fout = os.open(dest.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
            try:
                os.fchmod(fout, mode)
                try:
                    while os.copy_file_range(fin, fout, 1 << 30):
                        pass
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    os.lseek(fin, 0, os.SEEK_SET)
                    os.ftruncate(fout, 0)
                    os.lseek(fout, 0, os.SEEK_SET)
                    with open(fin, "rb", closefd=False) as a, open(fout, "wb", closefd=False) as b:
                        shutil.copyfileobj(a, b, 4 << 20)
            finally:
                os.close(fout)
        finally:
            os.close(fin)


def copy_tree(src: Path, dest: Path | None, *, vet: Callable[[Path, os.stat_result], None], limit: int) -> None:
    """Copy the folder src (followed as given) to the new folder dest, each folder and file of it
    opened without following a link and handed to `vet` (its path below src and fstat) before
    anything of it is copied: the copy holds the bytes of what was vetted, whatever is swapped in
    at src meanwhile. A relative link that stays inside src is copied as a link; another link, a
    FIFO, socket or device is refused, as is more than `limit` bytes of files in all. With no
    dest, everything is vetted and nothing copied."""
    sfd = os.open(src, _DIR)
    try:
        if dest is None:
            _copy_folder(sfd, None, src, Path(), vet, [limit])
            return
        with folder(dest.parent) as parent:
            os.mkdir(dest.name, 0o700, dir_fd=parent)
            dfd = os.open(dest.name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
        try:
            _copy_folder(sfd, dfd, src, Path(), vet, [limit])
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _copy_folder(sfd: int, dfd: int | None, src: Path, rel: Path, vet: Callable[[Path, os.stat_result], None],
                 left: list[int]) -> None:
    vet(src / rel, os.fstat(sfd))
    for name in sorted(os.listdir(sfd)):
        path = src / rel / name
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=sfd)
            if os.path.isabs(target) or os.path.normpath(rel / target).split(os.sep)[0] == os.pardir:
                raise Refused(path, f"it is a link to {target}, out of {src}")
            if dfd is not None:
                os.symlink(target, name, dir_fd=dfd)
        elif stat.S_ISDIR(st.st_mode):
            child = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=sfd)
            try:
                if dfd is None:
                    _copy_folder(child, None, src, rel / name, vet, left)
                    continue
                os.mkdir(name, 0o700, dir_fd=dfd)
                made = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=dfd)
                try:
                    _copy_folder(child, made, src, rel / name, vet, left)
                    os.fchmod(made, 0o755)
                finally:
                    os.close(made)
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(sfd, dfd, path, vet, left)
        else:
            raise Refused(path, "it is not a regular file, a folder or a link (a FIFO, a socket or a device)")


def _copy_file(sfd: int, dfd: int | None, path: Path, vet: Callable[[Path, os.stat_result], None], left: list[int]) -> None:
    fin = _open_to_read(path, sfd)
    try:
        st = os.fstat(fin)
        vet(path, st)
        left[0] -= st.st_size
        if left[0] < 0:
            raise Refused(path, "the folder holds more bytes than a copy of it may")
        if dfd is None:
            return
        mode = 0o755 if st.st_mode & 0o111 else READABLE
        fout = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
        with open(fout, "wb") as out:
            os.fchmod(fout, mode)
            size = st.st_size
            while size and (chunk := os.read(fin, min(4 << 20, size))):
                out.write(chunk)
                size -= len(chunk)
            if os.read(fin, 1):
                raise Refused(path, "it grew while it was copied")
    finally:
        os.close(fin)


def sha256(path: Path, *, limit: int, beneath: Path | None = None) -> str:
    """The hex sha256 of the regular file path, streamed, read as read_bytes reads (no link
    followed, a FIFO or device refused at once, more than `limit` bytes refused, from its size
    or once it grew past them while read). extforge.shared_read hashes through this."""
    digest = hashlib.sha256()
    with folder(path.parent, beneath=beneath) as dfd, os.fdopen(_open_to_read(path, dfd), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise Refused(path, f"it holds {size} bytes, more than the {limit} it may")
        read = 0
        while chunk := fh.read(min(4 << 20, limit + 1 - read)):
            read += len(chunk)
            digest.update(chunk)
    if read > limit:
        raise Refused(path, f"it grew past the {limit} bytes it may hold while it was read")
    return digest.hexdigest()


def read_bytes(path: Path, *, limit: int, beneath: Path | None = None, own: bool = False, tail: bool = False) -> bytes:
    """The bytes of the regular file path, at most `limit` of them: a link is not followed, a
    FIFO or device (/dev/zero) is refused at once, a bigger file is refused, not read (with
    `tail`: its last `limit` bytes, seeked to); `own`: only this user's file that nobody else
    may write. extforge.shared_read reads through this."""
    with folder(path.parent, beneath=beneath) as dfd, os.fdopen(_open_to_read(path, dfd, own=own), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit and tail:
            fh.seek(size - limit)
            return fh.read(limit)
        if size > limit:
            raise Refused(path, f"it holds {size} bytes, more than the {limit} it may")
        data = fh.read(limit + 1)
    if len(data) > limit:  # it grew while read
        raise Refused(path, f"it grew past the {limit} bytes it may hold while it was read")
    return data
