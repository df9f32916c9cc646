"""The packages a lock names: the prefix's records of them, the lock's records, and local
copies whose sha256 is checked against the lock before anything reads them.

Shared by install (which links them), trust (which reads their own paths.json) and verify.
"""

from __future__ import annotations

import json
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ..downloads import Limits, TooBig, download, fetch, local_path
from ..errors import ExtforgeError
from ..hashing import default_threads, digest_file, digests_file, file_key
from ..paths import mark_used, own_area
from ..safe_files import hard_link, make_dirs, remove, rename, temp_name
from .mirrors import Mirrors


def read_prefix_records(prefix: Path) -> list[dict]:
    meta = prefix / "conda-meta"
    if not meta.is_dir():
        raise ExtforgeError(f"{prefix} is not a conda environment", "it has no conda-meta folder", "pass the prefix given to `extforge install`")
    records = []
    for p in sorted(meta.glob("*.json")):
        try:
            record = json.loads(p.read_bytes())
        except (OSError, ValueError) as exc:
            record, why = None, str(exc)
        else:
            why = "it is not a package record (name, version, build)"
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("name", "version", "build")):
            raise ExtforgeError(
                f"{p} is not a readable package record", why,
                "the environment was damaged or edited: reinstall it with `extforge install` into a new prefix",
                exit_code=1,
            )
        records.append(record)
    return records


def store_dir() -> Path:
    """The package archives this user's installs checked (paths.own_area: in a cache root of
    another user's, a folder of this user's own)."""
    return own_area("pkgs")


def locked_records(lock_path: Path, env: str, platform: str = "linux-64") -> list:
    from rattler import LockFile

    if not lock_path.is_file():
        raise ExtforgeError(f"lock file {lock_path} not found", "", "run `extforge lock` first or pass --lock PATH")
    try:
        lock_file = LockFile.from_path(lock_path)
    except Exception as exc:  # rattler's ParseCondaLockError and I/O errors
        raise ExtforgeError(f"cannot read {lock_path}", str(exc), "restore it from version control or re-run `extforge lock`") from exc
    environment = lock_file.environment(env)
    if environment is None:
        names = [name for name, _ in lock_file.environments()]
        raise ExtforgeError(f"environment {env!r} is not in {lock_path}", f"it has: {', '.join(names)}", "pass one of those or re-run `extforge lock`")
    if not environment.platforms():
        others = sorted(name for name, e in lock_file.environments() if e.platforms())
        raise ExtforgeError(
            f"environment {env!r} of {lock_path} has no packages",
            "its features list no dependencies (pixi locks such an environment all the same: `default` is always there)",
            f"install one with packages ({', '.join(others) or 'none in this lock'}), or add dependencies to it and re-lock",
        )
    # rattler wants the lock file's own platform object, not a new LockPlatform.
    owned = next((p for p in environment.platforms() if p.name == platform), None)
    records = environment.conda_repodata_records_for_platform(owned) if owned else None
    if records is None:
        raise ExtforgeError(f"{lock_path} has no {platform} packages for {env!r}", "", f"add {platform} to the workspace platforms and re-lock")
    return records


def record_sha256(record: Any) -> str:
    value = record.sha256
    if value is None:
        raise ExtforgeError(f"{record.file_name} has no sha256 in the lock", "install refuses what it cannot verify", "re-lock against a channel indexed with sha256")
    return value.hex() if isinstance(value, bytes) else str(value)


def _record_md5(record: Any) -> str | None:
    md5 = getattr(record, "md5", None)  # a PackageRef has none
    return md5.hex() if isinstance(md5, bytes) else md5


def md5_size_mismatch(record: Any, path: Path, path_md5: str | None = None) -> str | None:
    """How a package whose sha256 matched the lock still disagrees with the lock's size or md5
    (rattler copies both into conda-meta, where conda and others trust them); None if it does not.
    path_md5: the file's md5 if the caller read it already."""
    size, want_size = path.stat().st_size, record.size
    if want_size and size != want_size:
        return f"sha256 as locked, but {size} bytes where the lock says {want_size}: the lock is inconsistent"
    md5 = _record_md5(record)
    if md5 and (got := path_md5 or digest_file(path, "md5")) != md5:
        return f"sha256 as locked, but md5 {got[:12]}… where the lock says {md5[:12]}…: the lock is inconsistent"
    return None


# Where a package can come from when its channel cannot be reached.
_ELSEWHERE = "point its channel at the site's mirror ([mirrors] in pixi's config.toml, or --channel-map NAME=URL)"


def _link_in(local: str, dest: Path, url: str, size: int | None, limits: Limits) -> str | None:
    """Hard-link a local channel file in as dest and hash the linked file; None where the
    kernel will not link it (another filesystem, another user's file)."""
    tmp = dest.parent / temp_name(dest.name, "part-")
    try:
        hard_link(Path(local), tmp, follow=True)
    except OSError:
        return None
    try:
        digest = fetch(url, None, size=size, limits=limits, path=tmp)
        rename(tmp, dest)
    except BaseException:
        remove(tmp)
        raise
    return digest


def _fetch_into(url: str, dest: Path, size: int | None = None) -> str:
    """Link, copy or download url to dest through a temp name; return the sha256 of the bytes.

    A local channel file on the store's filesystem is hard-linked, not copied (a torch env is
    ~4 GB of archives): the hash is taken of the linked file, and every later use re-hashes it,
    so a write into either name is caught as bytes that differ from the lock. At most `size`
    bytes (the lock's) are read: more raises TooBig; the other bounds are the downloader's."""
    make_dirs(dest.parent)
    limits = Limits.from_env()
    local = local_path(url)
    if local is not None and (linked := _link_in(local, dest, url, size, limits)) is not None:
        return linked
    # A temporary under a fresh name, renamed over dest: a link planted in the store is replaced, not written through.
    return download(url, dest, size=size, elsewhere=_ELSEWHERE)


class DigestMemo(Protocol):
    """Digests of store copies as they were when last hashed, kept where only this user can
    write (trust.ArchiveDigests): a copy whose stat is unchanged since is not read again."""

    def recall(self, path: Path, st: os.stat_result, sha256: str) -> dict[str, str] | None:
        """The digests of path, which now stats as st, when a record of exactly that is believed."""

    def remember(self, path: Path, st: os.stat_result, taken_ns: int, digests: dict[str, str]) -> None:
        """Record the digests of path, stat'ed as st (before and after the read) at taken_ns."""


def fetch_verified(records: list, store: Path, mirrors: Mirrors | None = None,
                   repaired: list[str] | None = None, memo: DigestMemo | None = None) -> tuple[dict[str, Path], list[str]]:
    """Verified local copies by file name, and the packages whose bytes differ from the lock.

    A store copy (the store may be shared) is re-hashed at every use unless `memo` vouches for
    it; one that differs is fetched again from its URL (through this site's mirrors), and noted
    in `repaired`."""
    mirrors = mirrors or Mirrors()
    local: dict[str, Path] = {}
    bad = []
    stored = _store_digests(records, store, memo)
    for r in records:
        want = record_sha256(r)
        dest = store / want / r.file_name
        digests = stored.get(dest)
        got = digests["sha256"] if digests is not None else None
        if got is not None and got != want:
            if repaired is not None:
                repaired.append(f"{dest} (sha256 {got[:12]}…, fetched again)")
            got = None
        elif got is None and os.path.islink(dest) and repaired is not None:
            repaired.append(f"{dest} (a symbolic link, fetched again)")
        if got is None:
            digests = None  # fetched again below: its md5 is read from the new copy
            size = r.size or None  # a lock record's, or a PackageRef's (0 or None: the lock names none)
            try:
                got = _fetch_into(mirrors.redirect(r.url), dest, size)
            except TooBig:
                bad.append(f"{r.file_name} (lock size {size} bytes, {mirrors.redirect(r.url)} gave more; stopped there)")
                continue
        if got != want:
            remove(dest)
            bad.append(f"{r.file_name} (lock sha256 {want[:12]}…, got {got[:12]}… from {mirrors.redirect(r.url)})")
            continue
        if (why := md5_size_mismatch(r, dest, digests.get("md5") if digests is not None else None)) is not None:
            bad.append(f"{r.file_name} ({why})")
            continue
        mark_used(dest.parent)
        local[r.file_name] = dest
    return local, bad


def _store_digests(records: list, store: Path, memo: DigestMemo | None) -> dict[Path, dict[str, str]]:
    """The sha256 (and the lock's md5, where it has one) of each store copy present, by path: one
    read per file, files on a thread pool (hashlib releases the GIL). A torch env's ~3 GB of
    archives were read twice, one after another, at every install: 9.6 s of it, then 2-10 s, now
    none where `memo` knows them unchanged."""

    def one(r: Any) -> tuple[Path, dict[str, str] | None]:
        want = record_sha256(r)
        dest = store / want / r.file_name
        taken_ns = time.time_ns()
        try:
            before = os.lstat(dest)  # a link swapped in is fetched over, not followed
        except OSError:
            return dest, None
        if not stat.S_ISREG(before.st_mode):
            return dest, None
        algorithms = ("sha256", "md5") if _record_md5(r) else ("sha256",)
        if memo is not None and (known := memo.recall(dest, before, want)) is not None and set(algorithms) <= set(known):
            return dest, known
        digests = digests_file(dest, algorithms)
        if memo is not None and digests["sha256"] == want and file_key(before) == file_key(os.lstat(dest)):
            memo.remember(dest, before, taken_ns, digests)
        return dest, digests

    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        return {dest: digests for dest, digests in pool.map(one, records) if digests is not None}
