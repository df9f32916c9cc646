"""The package cache's files as install verified them: a warm install links them unread.

rattler extracts each package once into its package cache and hard-links the files into every
prefix installed from it. install hashes what it linked (a staged file that is a hard link is
the cache's file itself) against the package's manifest, so the cache's files are verified the
first time they are linked. That is recorded per package in the user's private trust folder
(`extracted/<package sha256>.json`, signed as every record there): each file's size, mtime,
inode, mode, device and owner, for files owned by the installing user that nobody else may
write, and the entry's folder as extracted (a package extracted again starts over: the inode
numbers of the files removed may come back). After linking, a staged file that is one of those inodes with that size, mtime, mode and
owner (verify.check_files) needs no hash; every other file is hashed as before, and one that
differs sends its cache entry back to be extracted again (install.py). Files copied rather than
linked (placeholder files, rewritten for the prefix; a cache on another file system) are hashed
at every install, as `--rehash` makes every file.

Why this holds as a hash does: nobody but a file's owner and root can write a file whose mode
gives nobody else write access, change its mode or ACL, or set its mtime to anything but now;
a write by anyone else would first need one of those. So only the installing user (who can as
well sign a record, the key being theirs) or root can change such a file and leave its size,
mtime and mode as they were. The ctime, which verify's record also compares, is left out here:
every link or removal of any of a cache file's names (each install, each environment deleted)
moves it, and a record bound to it held for no second install.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .packages import record_sha256
from .trust import read_signed, trust_dir, write_signed

Inode = tuple[int, int]  # (device, inode)
_SCHEMA = 1


# What a verified inode of the package cache held when it was last found as recorded: its
# size, mtime, mode and sha256 (a tuple: a torch env has 25,000 of them, made at every install).
Verified = tuple[int, int, int, str]


def entry_dir(cache: Path, file_name: str) -> Path:
    """Where rattler extracts the package `file_name` in its package cache."""
    return cache / file_name.removesuffix(".conda").removesuffix(".tar.bz2")


def _record_path(sha256: str) -> Path:
    return trust_dir() / "extracted" / f"{sha256}.json"


def _linked_as_is(body: dict) -> dict[str, str]:
    """{path in the package: sha256} of the files rattler links as they are (no placeholder)."""
    sources = body.get("sources", {})
    return {sources.get(row[0], row[0]): row[2] for row in body["paths"] if row[1] == "hardlink" and row[2] and not row[3]}


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_dev, st.st_uid]


def _folder_key(entry: Path) -> list[int] | None:
    """The entry's folder as extracted: a package extracted again (its folder removed and made
    anew) is not vouched for by the record of the one before, whose inodes may come back."""
    try:
        st = os.lstat(entry)
    except OSError:
        return None
    return [st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns] if stat.S_ISDIR(st.st_mode) else None


def recall(records: list, cache: Path, manifests: dict[str, dict]) -> tuple[dict[Inode, Verified], dict[str, dict]]:
    """The cache's files the records vouch for, by inode, and each package's recorded files
    (by package sha256), which `remember` rewrites only where they changed."""
    trusted: dict[Inode, Verified] = {}
    recorded: dict[str, dict] = {}
    uid = os.geteuid()
    for r in records:
        body = manifests.get(r.name.normalized)
        entry = entry_dir(cache, r.file_name)
        record = read_signed(_record_path(record_sha256(r)))
        if (body is None or record is None or record.get("schema") != _SCHEMA or record.get("entry") != str(entry)
                or record.get("folder") != _folder_key(entry)):
            continue
        files = record.get("files")
        if not isinstance(files, dict):
            continue
        recorded[record_sha256(r)] = files
        shas = _linked_as_is(body)
        for rel, (size, mtime, ino, mode, dev, owner) in files.items():
            if (sha := shas.get(rel)) is not None and owner == uid:
                trusted[(dev, ino)] = (size, mtime, mode, sha)
    return trusted, recorded


def remember(records: list, cache: Path, manifests: dict[str, dict], found: dict[str, tuple[os.stat_result, str]],
             recorded: dict[str, dict]) -> None:
    """Record each cache file that was linked and found as its package has it: `found` holds the
    staged files' lstat (taken after linking) and sha256. A cache file is recorded when it is
    one of those inodes still, with that size, mtime and mode, is the installing user's and
    nobody else may write it; a package's record is written where it changed."""
    linked = {(st.st_dev, st.st_ino): (st, sha) for st, sha in found.values()}
    uid = os.geteuid()
    for r in records:
        body = manifests.get(r.name.normalized)
        if body is None:
            continue
        entry = entry_dir(cache, r.file_name)
        files = {}
        for rel, sha in _linked_as_is(body).items():
            try:
                st = os.lstat(f"{entry}/{rel}")
            except OSError:
                continue
            staged = linked.get((st.st_dev, st.st_ino))
            if (staged is not None and staged[1] == sha and st.st_uid == uid and not stat.S_IMODE(st.st_mode) & 0o022
                    and (staged[0].st_size, staged[0].st_mtime_ns, staged[0].st_mode) == (st.st_size, st.st_mtime_ns, st.st_mode)):
                files[rel] = _key(st)
        if files and files != recorded.get(record_sha256(r)):
            write_signed(_record_path(record_sha256(r)), {"schema": _SCHEMA, "entry": str(entry), "folder": _folder_key(entry),
                                                         "files": files})


# --- byte code the python package's interpreter found current ------------------------------
# Whether Python takes a shipped .pyc as it is depends on the .pyc's bytes and its source's bytes,
# mtime and size alone (its header holds the source's mtime and size, or a hash of its bytes),
# and on the interpreter (its magic number). Install asks the interpreter once (receipt.py's
# compile step reads each .pyc's header and, for a hash-checked one, its whole source: 6,500
# torch modules, 0.2-0.4 s) and remembers the answer, signed, per python package: a later
# install sends it only the sources whose key it has not found current before. A source it
# cannot compile (torch ships test data of Python 3.12's syntax) is remembered as well: its bytes
# will not compile the next time either, and asking again took a Python process every install.
_BYTECODE_SCHEMA = 1
_BYTECODE_KEPT = 200_000  # keys per python package; past that the record starts over


def _bytecode_path(python_sha256: str) -> Path:
    return trust_dir() / "bytecode" / f"{python_sha256}.json"


def bytecode_keys(sources: list[str], tag: str, staged: dict[str, tuple[os.stat_result, str]]) -> dict[str, str]:
    """{source: key} for each staged source: the key binds the source's sha256, mtime and size
    and the sha256 of its .pyc of cache tag `tag` where one is staged, as install's check found them."""
    keys = {}
    for source in sources:
        folder, _, name = source.rpartition("/")
        pyc = staged.get(f"{folder}/__pycache__/{name.removesuffix('.py')}.{tag}.pyc")
        if (src := staged.get(source)) is not None:
            st, sha = src
            keys[source] = hashlib.blake2b(f"{sha}:{st.st_mtime_ns}:{st.st_size}:{pyc[1] if pyc else ''}".encode(),
                                           digest_size=16).hexdigest()
    return keys


def recall_bytecode(python_sha256: str) -> tuple[str, set[str]]:
    """The python package's cache tag and the keys of the sources it found current, or could not
    compile, before."""
    body = read_signed(_bytecode_path(python_sha256))
    if body is None or body.get("schema") != _BYTECODE_SCHEMA or not isinstance(body.get("tag"), str):
        return "", set()
    keys = body.get("current")
    return body["tag"], {k for k in keys if isinstance(k, str)} if isinstance(keys, list) else set()


def remember_bytecode(python_sha256: str, tag: str, known: set[str], found: set[str]) -> None:
    """Add the keys the interpreter found current or could not compile this time to those
    `recall_bytecode` gave."""
    if found <= known:
        return
    keys = known | found if len(known) + len(found) <= _BYTECODE_KEPT else found
    write_signed(_bytecode_path(python_sha256), {"schema": _BYTECODE_SCHEMA, "tag": tag, "current": sorted(keys)})
