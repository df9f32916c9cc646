"""A local channel's archives checked against the sha256 and size its index claims before rattler
or rattler-build may extract them, and the package cache's entries checked once against them.

rattler checks a download against the index's sha256, but it extracts a `file://` package as the
file is: the bytes go into its package cache entry `<name>-<version>-<build>`, recorded under the
sha256 the index claims (or none, where it claims none). Every later environment that asks for that
name, version, build and sha256 (or for any sha256, where none was recorded) links that entry,
whichever channel it solved from. A channel someone else can write (a group's output folder
passed as `-c`, the internal channel other admins publish to, a channel folder on NFS), used once,
would so put their files into every later build environment and audit target of this user's,
even from the user's own channels. So nothing from a local channel reaches rattler (an audit
target's install) or rattler-build (a build's channels and its output folder, which it
re-indexes without hashing the files its index lists) unless its archive hashes as its index
says. A digest is remembered per file (`trust-<uid>/local-archives/<device>-<inode>.json`: size,
mtime, inode, mode, device and, for a file others could write or link, its ctime), so a warm
check stats each archive and reads nothing.

An entry extracted before this check existed may hold another channel's bytes under the key of
one of these archives. Entries are vouched for in `trust-<uid>/rattler-entries/` (each entry's
folder as extracted and its recorded sha256): one that is not is compared once with the archive
whose sha256 it is recorded under (its info/ metadata and every file paths.json hashes), and
removed, so rattler extracts it again from the checked archive, where it differs. One that
rattler extracted after the check, from a checked archive, is vouched for afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..archive import MAX_METADATA_BYTES, package_tars
from ..cache import Entry, remove
from ..channel_ref import REPODATA_LIMIT, local_folder
from ..errors import ExtforgeError
from ..hashing import hash_many, memo_key, stable_key
from ..paths import private_dir
from ..safe_files import make_dirs, write_atomic
from ..shared_read import Refused, parse_json, read_bytes, read_json
from ..ui import log

_HEX = frozenset("0123456789abcdef")
# What rattler reads from an entry to link it, besides the files paths.json lists.
_INFO = ("info/paths.json", "info/index.json", "info/link.json")
_REGISTER_LIMIT = 32 << 20


@dataclass(frozen=True)
class Claim:
    """A package as a local channel's index gives it to rattler: where its archive is and what
    its index says the archive holds."""

    channel: str
    file_name: str
    path: Path
    sha256: str | None
    size: int | None

    @property
    def entry(self) -> str:
        """The name of its package cache entry."""
        return self.file_name.removesuffix(".conda").removesuffix(".tar.bz2")


def claims_of(records: Iterable[Any]) -> list[Claim]:
    """The local ones among rattler's RepoDataRecords (a remote one is hashed by rattler itself)."""
    out = []
    for r in records:
        url = str(r.url)
        if not url.startswith("file://"):
            continue
        path = local_folder(url)
        assert path is not None
        sha = r.sha256.hex() if r.sha256 else None
        channel = local_folder(r.channel) if r.channel and str(r.channel).startswith("file://") else None
        out.append(Claim(str(channel or r.channel or path.parent), r.file_name, path, sha, r.size or None))
    return out


def channel_claims(channels: Sequence[str], subdirs: Sequence[str]) -> list[Claim]:
    """Every package the indexes of the local `channels` list for `subdirs`, at the URL rattler
    computes for it (its record's subdir, the index's base_url)."""
    from rattler import Channel, RepoData

    found: list[Claim] = []
    for channel in channels:
        folder = local_folder(channel)
        if folder is None:
            continue
        for subdir in subdirs:
            index = folder / subdir / "repodata.json"
            try:
                st = os.lstat(index)
            except OSError:
                continue
            # Not one rattler-build would read either: a FIFO, a link, a file past any channel's size.
            if not stat.S_ISREG(st.st_mode) or st.st_size > REPODATA_LIMIT:
                continue
            try:
                records = RepoData.from_path(index).into_repo_data(Channel(folder.as_uri()))
            except Exception:  # rattler's parse error: rattler-build refuses that index itself
                continue
            found += claims_of(records)
    return found


def _memo_path(st: os.stat_result) -> Path:
    return private_dir("trust") / "local-archives" / f"{st.st_dev}-{st.st_ino}.json"


def _memo(data: object) -> tuple[list[int], str]:
    if not (isinstance(data, dict) and isinstance(key := data.get("key"), list) and all(isinstance(k, int) for k in key)
            and isinstance(sha := data.get("sha256"), str) and len(sha) == 64 and set(sha) <= _HEX):
        raise ValueError("it is not a digest record")
    return key, sha


def _recall(st: os.stat_result) -> str | None:
    try:
        key, sha = read_json(_memo_path(st), _memo, limit=4096, own=True)
    except (OSError, Refused):
        return None
    return sha if key == stable_key(st) else None


def _remember(st: os.stat_result, taken_ns: int, sha256: str) -> None:
    key = memo_key(st, taken_ns)
    if key is not None:
        path = _memo_path(st)
        make_dirs(path.parent)
        write_atomic(path, json.dumps({"key": key, "sha256": sha256}).encode(), mode=0o600, sync=False)


def _difference(claim: Claim, st: os.stat_result, sha256: str | None) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is no regular file"
    if claim.sha256 is None:
        return "has no sha256 in the index (rattler would cache it under none, for any later sha256 to take)"
    if claim.size is not None and st.st_size != claim.size:
        return f"is {st.st_size} bytes where the index says {claim.size}"
    if sha256 is not None and sha256 != claim.sha256:
        return f"has sha256 {sha256[:12]}… where the index says {claim.sha256[:12]}…"
    return None


def _unchanged(path: Path, before: os.stat_result) -> bool:
    try:
        return stable_key(os.lstat(path)) == stable_key(before)
    except OSError:
        return False


def check(claims: Sequence[Claim]) -> None:
    """Raise (exit 1) naming every claim whose archive does not hash, or size, as its index says.
    A missing archive is left to rattler, which cannot extract it either."""
    bad: list[str] = []
    todo: dict[Path, tuple[Claim, os.stat_result]] = {}
    taken_ns = time.time_ns()
    for claim in claims:
        try:
            st = os.lstat(claim.path)
        except OSError:
            continue
        why = _difference(claim, st, None)
        if why is None and _recall(st) != claim.sha256:
            todo[claim.path] = (claim, st)
        elif why is not None:
            bad.append(f"{claim.file_name} of {claim.channel} {why}")
    for path, got in hash_many(todo).items():
        claim, before = todo[path]
        if isinstance(got, OSError):
            bad.append(f"{claim.file_name} of {claim.channel} cannot be read ({got.strerror})")
        elif (why := _difference(claim, before, got)) is not None:
            bad.append(f"{claim.file_name} of {claim.channel} {why}")
        elif _unchanged(path, before):
            _remember(before, taken_ns, got)
    if bad:
        raise ExtforgeError(
            f"a local channel's index claims other bytes than its package holds: {'; '.join(sorted(bad))}",
            "rattler extracts a local package without hashing it, into the package cache entry every later "
            "environment of that name, version, build and sha256 links from, whichever channel it comes from",
            "nothing was installed or built; leave that channel out, or have its owner publish the package again "
            "(a channel of your own: `extforge publish` re-indexes it)",
            exit_code=1,
        )


# --- the package cache's entries -------------------------------------------------------------

def _register_path(cache: Path) -> Path:
    return private_dir("trust") / "rattler-entries" / f"{hashlib.sha256(str(cache).encode()).hexdigest()[:16]}.json"


def _entries(data: object) -> dict[str, list]:
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list)}


def _register(cache: Path) -> dict[str, list]:
    try:
        return read_json(_register_path(cache), _entries, limit=_REGISTER_LIMIT, own=True)
    except (OSError, Refused):
        return {}


def _entry_key(cache: Path, name: str) -> list | None:
    """An entry as extracted (its folder's inode, device, mtime and ctime; the sha256 rattler
    recorded beside it), or None where there is no entry."""
    try:
        st = os.lstat(cache / name)
        lock = read_bytes(cache / f"{name}.lock", limit=64)
    except (OSError, Refused):
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return [st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, lock[8:40].hex() if len(lock) >= 40 else None]


def _info_members(archive: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for tar in package_tars(archive, "info"):
        for m in tar:
            if m.name in _INFO and m.isfile() and m.size <= MAX_METADATA_BYTES:
                found[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return found


def _holds(entry: Path, archive: Path) -> bool:
    """Whether a cache entry holds what the (checked) archive holds: the info/ files rattler
    links by, and every file with the sha256 paths.json gives it."""
    info = _info_members(archive)
    for name in _INFO:
        try:
            here: bytes | None = read_bytes(entry / name, limit=MAX_METADATA_BYTES, beneath=entry)
        except FileNotFoundError:
            here = None
        except Refused:
            return False
        if here != info.get(name):
            return False
    try:
        data = parse_json(info.get("info/paths.json", b"{}"), "info/paths.json")
    except ValueError:
        return False
    rows = data.get("paths") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return False
    want = {entry / row["_path"]: row["sha256"] for row in rows if isinstance(row, dict)
            and isinstance(row.get("_path"), str) and isinstance(row.get("sha256"), str)
            and not row["_path"].startswith("/") and ".." not in row["_path"].split("/")}
    got = hash_many(want)
    return all(got.get(path) == sha for path, sha in want.items())


def vouch_entries(claims: Sequence[Claim], cache: Path) -> None:
    """Before rattler links from `cache`: every entry of a (checked) claim that is not vouched
    for is compared with the archive whose sha256 it is recorded under, and removed where it
    differs (rattler then extracts it again). An entry recorded under no sha256 is removed."""
    register = _register(cache)
    by_sha = {(c.entry, c.sha256): c for c in claims}
    todo = []
    for name in sorted({c.entry for c in claims}):
        key = _entry_key(cache, name)
        # One recorded under another sha256 is extracted again by rattler for any of these claims.
        if key is not None and register.get(name) != key and (key[4] is None or (name, key[4]) in by_sha):
            todo.append((name, key))
    if todo:
        log.info("comparing %d package cache entries not vouched for with their checked archives (once)", len(todo))
    for name, key in todo:
        source = by_sha.get((name, key[4]))
        if source is not None and _holds(cache / name, source.path):
            register[name] = key
        else:
            # Renamed away first, as a prune does: an install linking from it sees it whole or not at all.
            remove(Entry("rattler", cache / name, 0.0, 0, cache, os.geteuid()))
            register.pop(name, None)
    if todo:
        _save(cache, register)


def vouch_extracted(claims: Sequence[Claim], cache: Path) -> None:
    """After rattler ran: the entries it extracted from the checked claims are vouched for."""
    register = _register(cache)
    shas = {(c.entry, c.sha256) for c in claims}
    fresh = {name: key for name, sha in shas if (key := _entry_key(cache, name)) is not None
             and key[4] == sha and register.get(name) != key}
    if fresh:
        _save(cache, register | fresh)


def _save(cache: Path, register: dict[str, list]) -> None:
    path = _register_path(cache)
    make_dirs(path.parent)
    write_atomic(path, json.dumps(register).encode(), mode=0o600, sync=False)
