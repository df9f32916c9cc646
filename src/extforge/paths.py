"""Where extforge keeps state outside a checkout."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from .errors import ExtforgeError
from .safe_files import folder, make_dirs, make_private_dir, not_private_why, remove_quietly, touch


@cache
def _stores_no_files(path: Path) -> bool:
    """Whether path (or its nearest existing folder) is on a kernel interface such as /proc or
    /sys, a file system of no blocks that takes no new files. Asked once a process: cache_root
    is called for every record an install reads, and a statfs on a network file system is a
    round trip to its servers."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return os.statvfs(here).f_blocks == 0
    except OSError:
        return False


def cache_root() -> Path:
    """The content-addressed cache shared by every checkout on this machine.

    Kept outside the clone so CI on a fresh clone reuses big downloads and built
    upstream packages; everything in it can be rebuilt, so deleting it is always safe.
    """
    env = os.environ.get("EXTFORGE_CACHE")
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():
            raise ExtforgeError(f"$EXTFORGE_CACHE={env!r} is a relative path",
                                "it would name another folder in every directory extforge runs from",
                                "set it to an absolute path (e.g. $HOME/.cache/extforge) or unset it")
        if path.exists() and not path.is_dir():
            raise ExtforgeError(f"$EXTFORGE_CACHE={env!r} is not a folder", "extforge keeps its cache's folders there",
                                "point it at a folder (it is created if missing) or unset it")
        if _stores_no_files(path):
            raise ExtforgeError(f"$EXTFORGE_CACHE={env!r} is on a file system that stores no files",
                                "it is a kernel interface (like /proc or /sys), where extforge cannot keep its cache's folders",
                                "point it at a folder on a disk (e.g. $HOME/.cache/extforge) or unset it")
        return path
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "extforge"


_warned: set[Path] = set()


def private_dir(name: str, *, create: bool = True) -> Path:
    """This user's own folder `<name>-<uid>` under the cache root (mode 0700, made by this user),
    created if missing (with `create`; else where it is or would be).

    In a cache several users share, another user may have put a folder, link or file under that
    name first, and in a sticky folder (as /tmp is) nobody but its owner can remove it: then a
    folder `<name>-<uid>.<random>` of this user's is used instead (a warning names the squatted
    name once), and found again by every later run, so what is kept there (a secret) stays. A
    folder of this user's that others may write is refused: `chmod 700` is its owner's to run.

    The folder found is remembered for the process and returned again while it is still the same
    folder (device and inode) and private: an install asks for the trust folder for every record
    it reads (about 600 times for 60 packages), each a listing of the cache root (and, with
    $EXTFORGE_CACHE set, a statfs of its file system)."""
    root = cache_root()
    uid = os.geteuid()
    known = _found_private.get((root, name, uid))
    if known is not None:
        try:
            st = os.lstat(known[0])
        except OSError:
            pass
        else:
            if (st.st_dev, st.st_ino) == known[1] and not_private_why(st) is None:
                return known[0]
    found_dir = _private_dir(root, name, uid, create)
    try:
        st = os.lstat(found_dir)
    except OSError:
        return found_dir  # create=False, none there yet
    if not_private_why(st) is None:
        _found_private[(root, name, uid)] = (found_dir, (st.st_dev, st.st_ino))
    return found_dir


# (cache root, name, euid) -> the private_dir found, with its (st_dev, st_ino).
_found_private: dict[tuple[Path, str, int], tuple[Path, tuple[int, int]]] = {}


def _private_dir(root: Path, name: str, uid: int, create: bool) -> Path:
    first = root / f"{name}-{uid}"
    try:
        with folder(root) as dfd:
            found = {n: os.stat(n, dir_fd=dfd, follow_symlinks=False) for n in os.listdir(dfd)
                     if n == first.name or n.startswith(first.name + ".")}
    except FileNotFoundError:
        found = {}
    private = sorted(n for n, st in found.items() if not_private_why(st) is None)
    if private:
        return root / private[0]  # `first` sorts before its fallbacks
    if not create:
        return first
    squatted = first.name in found and (found[first.name].st_uid != uid or not stat.S_ISDIR(found[first.name].st_mode))
    chosen = root / f"{first.name}.{secrets.token_hex(8)}" if squatted else first
    try:
        make_dirs(root)
        make_private_dir(chosen, beneath=root, own_group=True)  # one of this user's with loose modes is refused here
    except OSError as exc:
        raise ExtforgeError(f"cannot create {chosen}: {exc.strerror}",
                            "extforge keeps what only you may change (installs' package caches, the manifests it "
                            "trusts) in a folder of your own under its cache root",
                            "point EXTFORGE_CACHE at a folder you can write, or ask its owner to let you") from None
    if squatted and first not in _warned:
        _warned.add(first)
        logging.getLogger("extforge").warning(
            "%s is not yours (owner uid %d; someone who can write %s put it there): using %s instead; an admin can "
            "remove %s", first, found[first.name].st_uid, root, chosen, first)
    return chosen


def own_area(name: str, *, create: bool = True) -> Path:
    """Where this user keeps the cache area `name`, whose entries it takes as its own without
    checking them again: hard-links them into its environments, serves them in its mirror
    channel, runs them as its CUDA toolkit, audits against them.

    `<cache>/<name>` where nobody else can have put anything there (the usual one-user cache):
    the cache root and that folder, if there, this user's and writable by nobody else. Else (a
    site's shared cache root, sticky or a group's, even one this user owns) its private_dir: an
    entry's name is a content hash anyone can compute, so another user who can write the area
    could plant the package, toolkit or environment this user is about to look up."""
    root = cache_root()
    shared = root / name
    for path, st in ((root, _stat(root, follow=True)), (shared, _stat(shared, follow=False))):
        if st is not None and (not stat.S_ISDIR(st.st_mode) or _others_may_write(st)):
            log = logging.getLogger("extforge")
            if path == shared and shared not in _warned:
                _warned.add(shared)
                log.warning("%s is not yours alone (owner uid %d, mode %o): using a folder of your own instead",
                            shared, st.st_uid, stat.S_IMODE(st.st_mode))
            return private_dir(name, create=create)
    return shared


def _stat(path: Path, *, follow: bool) -> os.stat_result | None:
    try:
        return path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return None  # made by this run, as this user's


def _others_may_write(st: os.stat_result) -> bool:
    """Whether another user may have written what `st` describes: not this user's, or writable
    by its group or by anyone."""
    return st.st_uid != os.geteuid() or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def who_else_may_write(st: os.stat_result, *, sticky_folder_ok: bool = False) -> str | None:
    """Who besides this user and root may change what `st` describes (a file, or which entries a
    folder holds), said for an error; None when nobody may. OpenSSH's StrictModes with Debian's
    user-group-modes: owned by this user or root; writable by its group only where the group is
    this user's own (no other member, nobody else's primary group: a user private group, umask
    002); by nobody else. POSIX ACLs granting a named user write show in the group bits (the mask).
    With `sticky_folder_ok`, a sticky folder (/tmp) passes whoever may add entries to it: none
    of them may rename or remove an entry they do not own."""
    mode = st.st_mode
    said = f"(owner uid {st.st_uid}, {stat.filemode(mode)}, group {_group_name(st.st_gid)})"
    if st.st_uid not in (os.geteuid(), 0):
        return f"its owner, uid {st.st_uid}{_user_name(st.st_uid)}, may write it {said}"
    if sticky_folder_ok and stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH:
        return f"anyone may write it {said}"
    if mode & stat.S_IWGRP:
        members = _group_members(st.st_gid)
        me = _user_name(os.geteuid()).strip(" ()")
        if members != {me}:
            others = ", ".join(sorted(members - {me})) or "nobody known to this machine"
            return f"the members of its group may write it {said}; its members besides you: {others}"
    return None


def _user_name(uid: int) -> str:
    try:
        return f" ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return ""


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


@cache
def _group_members(gid: int) -> frozenset[str]:
    """The users of group gid: those it names, and those whose primary group it is."""
    try:
        named = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        named = set()
    return frozenset(named | {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid})


def rattler_cache_dir(*, create: bool = True) -> Path:
    """Package cache for rattler installs and rattler-build environments (own_area: a user's
    environments hard-link its files).

    rattler-build otherwise extracts into ~/.cache/rattler (5 GB for a torch build env);
    keeping it under our cache root makes one knob control all of extforge's disk use.
    """
    env = os.environ.get("RATTLER_CACHE_DIR")
    return Path(env) if env else own_area("rattler", create=create)


def rattler_pkgs_dir(*, create: bool = True) -> Path:
    """Where packages are extracted: rattler-build's layout under RATTLER_CACHE_DIR. py-rattler's
    install takes the extraction folder itself; given rattler_cache_dir() it would keep a second
    copy of every torch (~5 GB) beside rattler-build's."""
    return rattler_cache_dir(create=create) / "pkgs"


def mark_used(path: Path) -> None:
    """Record that a cache entry was reused now (its mtime), so `extforge cache --prune` keeps it."""
    try:
        touch(path)
    except (OSError, ExtforgeError):
        pass  # a read-only shared cache: the entry then ages by its creation time


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Folders of the naming before scratch_dir carry no pid; a day-old one belongs to no live run.
_LEGACY_SCRATCH_AGE_S = 24 * 3600


def sweep_scratch(kind: str, base: Path | None = None) -> list[Path]:
    """Remove scratch folders of `kind` that runs killed on this host left behind (their pid is gone)."""
    base = Path(tempfile.gettempdir()) if base is None else base
    mine = f"extforge-{kind}-{socket.gethostname()}-"
    removed = []
    for path in base.glob(f"extforge-{kind}-*"):
        if path.name.startswith(mine):
            pid = path.name[len(mine):].split("-", 1)[0]
            stale = pid.isdigit() and not _alive(int(pid))
        else:
            try:
                stale = path.name.count("-") == 2 and time.time() - path.lstat().st_mtime > _LEGACY_SCRATCH_AGE_S
            except OSError:
                stale = False
        if stale and path.is_dir() and not path.is_symlink():
            remove_quietly(path)
            removed.append(path)
    return removed


@contextmanager
def scratch_dir(kind: str) -> Iterator[Path]:
    """A temporary folder `extforge-KIND-HOST-PID-*` in TMPDIR, removed on every exit path.

    A SIGKILL skips every cleanup, so each new one first removes those of dead runs on this host."""
    sweep_scratch(kind)
    path = Path(tempfile.mkdtemp(prefix=f"extforge-{kind}-{socket.gethostname()}-{os.getpid()}-"))
    try:
        yield path
    finally:
        remove_quietly(path)
