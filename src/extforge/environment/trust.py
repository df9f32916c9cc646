"""What install and verify trust: the packages the lock names, and records no prefix writer can forge.

A prefix (often on NFS, writable by a group) holds conda-meta records that anyone who can
write the prefix can rewrite, so file hashes never come from there. They come from each
package's own `info/paths.json`, read from an archive whose sha256 matched the lock, and are
kept as a *manifest* keyed by that sha256 in a folder private to the user
(`<cache>/trust-<uid>`, mode 0700, refused when anyone else could write it; one another user
put under that name is passed by for a `trust-<uid>.<random>` of the user's). Files whose prefix
placeholder the installer rewrote get their expected in-prefix sha256 computed here, the way
rattler rewrites them, from the archive's original bytes (once per package and prefix).

Every file in that folder (manifests, the record of files unchanged since a clean run) carries
an HMAC-SHA256 keyed with a per-user secret kept there too, so a copy planted or edited by
someone else is rejected and rebuilt rather than believed. Install's journal, kept in the
prefix, carries the same MAC (`sign`), so install undoes only what it wrote there itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from .. import archive as archive_rules
from ..archive import check_package, package_tars
from ..errors import ExtforgeError
from ..hashing import default_threads, digests_file, file_key, memo_key, stable_key
from ..paths import private_dir
from ..safe_files import read_bytes
from .mirrors import Mirrors
from .packages import fetch_verified, store_dir

# 3: each path also carries the payload's mode bits and, for a symbolic link, its target.
# 4: shebangs of prefixes with a space are expected in rattler's /bin/sh form (earlier: /usr/bin/env).
# 5: a noarch: python package's manifest says so, with its entry points (placed per prefix).
SCHEMA = 5
# Longest shebang line the Linux kernel reads; rattler falls back to /usr/bin/env beyond it.
MAX_SHEBANG = 127
# A placeholder file read from the package cache whole (a libpython is ~30 MB); a bigger one
# is read from the archive's stream.
MAX_PLACEHOLDER_FILE = 256 << 20


@dataclass(frozen=True)
class PackageRef:
    """A package as the lock (or, without a lock, the prefix) names it."""

    name: str
    file_name: str
    url: str
    sha256: str
    size: int | None = None  # bytes, as the lock says (None: it names none; a download then stops at the cap)


def trust_dir() -> Path:
    """The user's private folder for manifests, records and the HMAC secret (paths.private_dir:
    one another user planted under its name in a shared cache is passed by, not obeyed)."""
    return private_dir("trust")


# The secret's bytes by the stat of its file (device, inode, size, mtime): every signed record
# read or written needs it, an install several hundred times.
_secrets: dict[tuple[int, int, int, int], bytes] = {}


def _secret(d: Path) -> bytes:
    path = d / "secret"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and (known := _secrets.get((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))) is not None:
        return known
    if st is None:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".secret-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(32))
        try:
            os.link(tmp, path)  # two first runs at once: the first link wins, both read it
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path, "rb") as fh:
        st, secret = os.fstat(fh.fileno()), fh.read()
    _secrets[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)] = secret
    return secret


def sign(body: dict) -> bytes:
    """body as JSON, after a line with its HMAC-SHA256 keyed by the user's secret: what
    `verify_signed` accepts back only from this user (and this cache)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return hmac.new(_secret(trust_dir()), data, "sha256").hexdigest().encode() + b"\n" + data


def verify_signed(raw: bytes) -> dict | None:
    """The body `sign` wrapped in raw, or None when its HMAC is missing or does not match."""
    mac, _, data = raw.partition(b"\n")
    want = hmac.new(_secret(trust_dir()), data, "sha256").hexdigest().encode()
    if not hmac.compare_digest(mac, want):
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def write_signed(path: Path, body: dict) -> None:
    data = sign(body)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".w-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def read_signed(path: Path) -> dict | None:
    """The body, or None when the file is missing, unreadable or its HMAC does not match."""
    try:
        return verify_signed(path.read_bytes())
    except OSError:
        return None


# --- reading a verified archive -------------------------------------------------------------

def _read_members(archive: Path, part: Literal["info", "pkg"], names: set[str]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for tar in package_tars(archive, part):
        for m in tar:
            if m.name in names and m.isfile():
                found[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
                if len(found) == len(names):
                    return found  # a package's scripts come early (bin/): torch's 1.2 GB is not read to its end
    return found


def read_paths_json(archive: Path) -> list[dict]:
    raw = _read_members(archive, "info", {"info/paths.json"}).get("info/paths.json")
    if raw is None:
        raise ExtforgeError(f"{archive.name} has no info/paths.json", "its files cannot be checked", "rebuild the package")
    return json.loads(raw).get("paths", [])


# --- archives whose member paths passed the extraction rules ----------------------------------

def _rules_id() -> str:
    """Which extraction rules a check passed: a pass recorded under other rules is checked again."""
    return hashlib.sha256(Path(archive_rules.__file__).read_bytes()).hexdigest()


def _check_and_record(sha256: str, path: Path, rules: str) -> None:
    taken_ns = time.time_ns()
    before = os.stat(path)
    check_package(path)  # raises, naming the first unsafe member
    # Recorded only when the bytes checked are the bytes with this sha256: hashed after the check,
    # the inode unchanged throughout (a write in between moves its ctime, which no user can set back).
    digests = digests_file(path, ("sha256", "md5"))
    if digests["sha256"] == sha256 and file_key(os.stat(path)) == file_key(before):
        write_signed(trust_dir() / "checked" / f"{sha256}.json", {"sha256": sha256, "rules": rules})
        ARCHIVE_DIGESTS.remember(path, before, taken_ns, digests)


def check_archives(archives: dict[str, Path]) -> int:
    """Check the member paths of every archive (by its sha256, verified by the caller) that this
    user has not seen pass under the current rules, biggest first on a thread pool; the first unsafe
    one raises. Each pass is recorded, signed: decompressing a torch env's ~3 GB of archives took
    ~9 s of every install. How many archives were checked."""
    rules = _rules_id()
    todo = sorted(((sha256, path) for sha256, path in archives.items()
                   if read_signed(trust_dir() / "checked" / f"{sha256}.json") != {"sha256": sha256, "rules": rules}),
                  key=lambda item: -item[1].stat().st_size)
    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        for _ in pool.map(lambda item: _check_and_record(item[0], item[1], rules), todo):
            pass
    return len(todo)


# --- archives whose digests were taken before -------------------------------------------------

class ArchiveDigests:
    """packages.DigestMemo kept in the trust folder (`archives/<sha256>.json`, signed): the
    digests of a store copy with the stat they were taken at. Hashing a torch env's ~3 GB of
    archives again took 10 s of every install; a copy whose size, mtime, ctime, inode, mode and
    device are as recorded is not read. The ctime is left out for a copy of the user's own that
    nobody else may write (as for the package cache's files, extracted.py: only its owner or
    root could then keep its mtime through an edit), since every hard link made to a channel's
    file moves it. Otherwise a record is written only where the ctime was older than the
    timestamp tick it was stat'ed in: a write within that tick would leave it as it was."""

    @staticmethod
    def _path(sha256: str) -> Path:
        return trust_dir() / "archives" / f"{sha256}.json"

    def recall(self, path: Path, st: os.stat_result, sha256: str) -> dict[str, str] | None:
        body = read_signed(self._path(sha256))
        if body is None or body.get("path") != str(path) or body.get("key") != stable_key(st):
            return None
        digests = body.get("digests")
        if not isinstance(digests, dict) or digests.get("sha256") != sha256:
            return None
        return {str(k): str(v) for k, v in digests.items()}

    def remember(self, path: Path, st: os.stat_result, taken_ns: int, digests: dict[str, str]) -> None:
        key = memo_key(st, taken_ns)
        if key is not None:
            write_signed(self._path(digests["sha256"]), {"path": str(path), "key": key, "digests": digests})


ARCHIVE_DIGESTS = ArchiveDigests()


# --- prefix placeholders, rewritten as rattler rewrites them ---------------------------------

_SHEBANG = re.compile(r"#!(?: *)(/(?:\\ |[^ \n\r\t])*)(.*)")
_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)?)?")


def _env_shebang(line: str) -> str:
    """rattler's rewrite of a shebang that cannot work as it is (too long, or holding a space):
    a python interpreter is run by path through a /bin/sh trampoline (a path with spaces stays
    usable), anything else is found on PATH with /usr/bin/env."""
    m = _SHEBANG.fullmatch(line)
    if not m:
        return line
    path, rest = m.group(1), m.group(2)
    exe = path.rsplit("/", 1)[-1]
    if _PYTHON.fullmatch(exe):
        return "#!/bin/sh\n'''exec' " + f'"{path}"{rest} "$0" "$@" #' + "'''"
    return f"#!/usr/bin/env {exe}{rest}"


def _replace_text(data: bytes, old: bytes, new: bytes) -> bytes:
    head = b""
    if data.startswith(b"#!"):
        end = data.find(b"\n")
        end = len(data) if end < 0 else end
        line = data[:end].decode("utf-8", "replace")
        if b" " in new:
            # As rattler does: rewritten first (the placeholder has no space), then replaced.
            if old in data[:end]:
                line = _env_shebang(line).replace(old.decode(), new.decode())
        else:
            line = line.replace(old.decode(), new.decode())
            if len(line.encode()) > MAX_SHEBANG:
                line = _env_shebang(line)
        head, data = line.encode(), data[end:]
    return head + data.replace(old, new)


def _replace_cstrings(data: bytes, old: bytes, new: bytes) -> bytes:
    """Each C string holding the placeholder is rewritten in place, padded with NULs to its length."""
    out = bytearray()
    pos = 0
    while (i := data.find(old, pos)) >= 0:
        end = data.find(b"\0", i)
        end = len(data) if end < 0 else end
        out += data[pos:i]
        string = data[i:end]
        replaced = string.replace(old, new)[: len(string)]
        out += replaced + b"\0" * (len(string) - len(replaced))
        pos = end
    return bytes(out + data[pos:])


def in_prefix_bytes(data: bytes, placeholder: str, prefix: str, file_mode: str) -> bytes:
    old, new = placeholder.encode(), prefix.encode()
    return _replace_cstrings(data, old, new) if file_mode == "binary" else _replace_text(data, old, new)


# --- manifests ------------------------------------------------------------------------------

def _payload_facts(archive: Path, placeholders: set[str]) -> tuple[dict[str, int], dict[str, str], dict[str, bytes]]:
    """One pass over a package's payload: each member's mode bits, each symbolic link's target,
    and the bytes of the files named in placeholders (paths.json records neither mode nor target)."""
    modes: dict[str, int] = {}
    targets: dict[str, str] = {}
    data: dict[str, bytes] = {}
    for tar in package_tars(archive, "pkg"):
        for m in tar:
            modes[m.name] = m.mode & 0o7777
            if m.issym():
                targets[m.name] = m.linkname
            elif m.name in placeholders and m.isfile():
                data[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return modes, targets, data


def _in_prefix_hashes(originals: dict[str, bytes], placeholders: dict[str, list], prefix: Path) -> dict[str, str]:
    return {
        path: hashlib.sha256(in_prefix_bytes(data, placeholders[path][3], str(prefix), placeholders[path][4])).hexdigest()
        for path, data in originals.items()
    }


def _entry_point_ok(spec: object) -> bool:
    # Each becomes bin/<name>: a name that left bin/ would have verify read outside the prefix.
    if not isinstance(spec, str) or "=" not in spec:
        return False
    name = spec.partition("=")[0].strip()
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _noarch_python(archive: Path) -> list[str] | None:
    """The entry points of a noarch: python package (info/link.json), None for any other package."""
    info = _read_members(archive, "info", {"info/index.json", "info/link.json"})
    try:
        index = json.loads(info.get("info/index.json", b"{}"))
        link = json.loads(info.get("info/link.json", b"{}"))
    except ValueError as exc:
        raise ExtforgeError(f"{archive.name} has an unreadable info/index.json or info/link.json: {exc}",
                            "its files cannot be placed", "rebuild the package") from exc
    noarch = link.get("noarch") if isinstance(link.get("noarch"), dict) else {}
    if index.get("noarch") != "python" and noarch.get("type") != "python":
        return None
    points = noarch.get("entry_points") or []
    if not isinstance(points, list) or not all(_entry_point_ok(p) for p in points):
        raise ExtforgeError(f"{archive.name}'s info/link.json has malformed entry points: {points!r}",
                            "each is `name = module:function`, the name a file name in bin/", "rebuild the package")
    return points


def build_manifest(archive: Path, sha256: str, prefix: Path, previous: dict | None = None,
                   extracted: Path | None = None) -> dict:
    """A package's manifest from its (already sha256-checked) archive: each path with its kind,
    sha256, placeholder, mode bits and link target, plus the in-prefix sha256 of its
    placeholder files for this prefix; for a noarch: python package, its entry points. The
    placeholder files' original bytes come from `extracted` (the package cache's copy of the
    package) where they hash as the manifest says, else from the archive."""
    body = previous or {"schema": SCHEMA, "sha256": sha256, "file": archive.name, "in_prefix": {}}
    if "paths" not in body:
        body["noarch_python"] = _noarch_python(archive)
        entries = read_paths_json(archive)
        placeholders = {e["_path"] for e in entries if e.get("prefix_placeholder") and e.get("path_type", "hardlink") == "hardlink"}
        modes, targets, originals = _payload_facts(archive, placeholders)
        body["paths"] = [
            [e["_path"], e.get("path_type", "hardlink"), e.get("sha256"), e.get("prefix_placeholder"), e.get("file_mode", "text"),
             modes.get(e["_path"]), targets.get(e["_path"])]
            for e in entries
        ]
    else:
        originals = {}
    placeholder_rows = {p[0]: p for p in body["paths"] if p[3] and p[1] == "hardlink"}
    if placeholder_rows and str(prefix) not in body["in_prefix"]:
        if not originals:
            originals = _extracted_originals(extracted, placeholder_rows) if extracted else {}
            if rest := set(placeholder_rows) - set(originals):
                originals |= _read_members(archive, "pkg", rest)
        body["in_prefix"][str(prefix)] = _in_prefix_hashes(originals, placeholder_rows, prefix)
    return body


def _extracted_originals(entry: Path, rows: dict[str, list]) -> dict[str, bytes]:
    """The original bytes of the placeholder files the package cache's copy holds as the package
    does (their sha256 the manifest's): torch's scripts otherwise cost a decompression of its
    archive up to them for every new prefix."""
    found = {}
    for path, row in rows.items():
        try:
            data = read_bytes(entry / path, limit=MAX_PLACEHOLDER_FILE)
        except (OSError, ExtforgeError):
            continue
        if row[2] and hashlib.sha256(data).hexdigest() == row[2]:
            found[path] = data
    return found


# --- noarch: python packages, placed for the environment's python ---------------------------

ENTRY_POINT = """# -*- coding: utf-8 -*-
import re
import sys

from {module} import {head}

if __name__ == '__main__':
\tsys.argv[0] = re.sub(r'(-script\\.pyw?|\\.exe)?$', '', sys.argv[0])
\tsys.exit({function}())
"""
# Where rattler writes the prefix into a script's shebang: a placeholder it replaces.
_STAND_IN = b"/extforge-prefix"


def entry_point_script(spec: str, python: str, prefix: Path) -> bytes:
    """What rattler writes at bin/<name> for the entry point `name = module:function` of a
    noarch: python package, for the python X.Y of the prefix."""
    module, _, function = spec.partition("=")[2].partition(":")
    function = function.strip()
    body = ENTRY_POINT.format(module=module.strip(), head=function.split(".")[0], function=function)
    return _replace_text(b"#!" + _STAND_IN + f"/bin/python{python}\n{body}".encode(), _STAND_IN, str(prefix).encode())


def _placed(path: str, site: str) -> str:
    if path.startswith("site-packages/"):
        return site + path[len("site-packages"):]
    if path.startswith("python-scripts/"):
        return "bin/" + path[len("python-scripts/"):]
    return path


def place_noarch_python(body: dict, python: str, prefix: Path) -> dict:
    """The manifest of a noarch: python package as installed in a prefix whose python is X.Y:
    site-packages/ under lib/pythonX.Y/, python-scripts/ in bin/, and each entry point's script
    (with its sha256). `sources` maps a moved path back to the package's own (the package cache's
    copy of the file)."""
    site = f"lib/python{python}/site-packages"
    placed = [(_placed(row[0], site), row) for row in body["paths"]]
    paths = [[path, *row[1:]] for path, row in placed]
    sources = {path: row[0] for path, row in placed if path != row[0]}
    for spec in body["noarch_python"]:
        script = entry_point_script(spec, python, prefix)
        paths.append([f"bin/{spec.partition('=')[0].strip()}", "hardlink", hashlib.sha256(script).hexdigest(),
                      None, "text", None, None])
    in_prefix = {key: {_placed(p, site): sha for p, sha in hashes.items()} for key, hashes in body["in_prefix"].items()}
    return {**body, "paths": paths, "sources": sources, "in_prefix": in_prefix}


# The package whose interpreter the environment runs, and install byte-compiles with.
PYTHON = "python"


def interpreter_path(path: str) -> bool:
    """Whether a path of the python package is part of its interpreter: all it ships but its
    site-packages (the executable, libpython, the standard library it imports)."""
    return "site-packages" not in path.split("/")


def interpreter_clashes(manifests: dict[str, dict]) -> list[tuple[str, str]]:
    """(package, path) of each path of the python package's interpreter that another package
    ships too: rattler may keep that package's copy in place, and it would run as python. Other
    paths may be shared (every nvidia-*-cu12 wheel ships nvidia/__init__.py)."""
    body = manifests.get(PYTHON)
    if body is None:
        return []
    own = {row[0] for row in body["paths"] if interpreter_path(row[0])}
    return sorted((name, row[0]) for name, other in manifests.items() if name != PYTHON
                  for row in other["paths"] if row[0] in own)


def python_minor(refs: list[PackageRef]) -> str | None:
    """X.Y of the python among the packages (its file is python-X.Y.Z-build.ext), None without one."""
    for ref in refs:
        if ref.name == PYTHON:
            version = ref.file_name[len("python-"):].split("-", 1)[0]
            return ".".join(version.split(".")[:2])
    return None


def manifest_path(sha256: str) -> Path:
    return trust_dir() / "manifests" / f"{sha256}.json"


def stored_manifest(sha256: str) -> dict | None:
    """The stored manifest of a package when it is genuine (signed, of this schema and package)."""
    body = read_signed(manifest_path(sha256))
    if body is None or body.get("schema") != SCHEMA or body.get("sha256") != sha256:
        return None
    return body


def _in_prefix_path(sha256: str, prefix: Path) -> Path:
    return trust_dir() / "in-prefix" / f"{hashlib.sha256(f'{sha256}:{prefix}'.encode()).hexdigest()[:32]}.json"


def _knows(body: dict, sha256: str, prefix: Path) -> bool:
    """Whether a manifest holds what its placeholder files hash to in this prefix: in its own
    in_prefix (the prefix it was made for), or in the prefix's record beside it, then added."""
    if str(prefix) in body["in_prefix"] or not any(p[3] for p in body.get("paths", ())):
        return True
    record = read_signed(_in_prefix_path(sha256, prefix))
    hashes = record.get("hashes") if record and record.get("sha256") == sha256 and record.get("prefix") == str(prefix) else None
    if not isinstance(hashes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()):
        return False
    body["in_prefix"][str(prefix)] = hashes
    return True


def ensure_manifest(ref: PackageRef, archive: Path, prefix: Path, extracted: Path | None = None,
                    stored: dict | None = None) -> dict:
    """The package's manifest, knowing this prefix: `stored` (stored_manifest's, read already) or
    the stored one. A new prefix's placeholder hashes are kept in a record of their own: they
    were added to the manifest, which grew by every prefix ever installed (torch's: 2.7 MB of
    JSON after 100 prefixes, read three times and written once for each new one)."""
    body = stored if stored is not None else stored_manifest(ref.sha256)
    if body is not None and "paths" in body and _knows(body, ref.sha256, prefix):
        return body
    made = body is None or "paths" not in body
    body = build_manifest(archive, ref.sha256, prefix, body, extracted)
    if made:
        write_signed(manifest_path(ref.sha256), body)
    else:
        write_signed(_in_prefix_path(ref.sha256, prefix), {"schema": SCHEMA, "sha256": ref.sha256, "prefix": str(prefix),
                                                           "hashes": body["in_prefix"][str(prefix)]})
    return body


def expected_paths(body: dict, prefix: Path) -> Iterator[tuple[str, str | None]]:
    """(relative path, expected sha256) of a package in a prefix; None: check presence only
    (symbolic links, and files the package lists without a hash)."""
    in_prefix = body["in_prefix"].get(str(prefix), {})
    for path, kind, sha, placeholder, *_ in body["paths"]:
        if kind != "hardlink" or not sha:
            yield path, None
        else:
            yield path, in_prefix.get(path, sha) if placeholder else sha


class Expected(NamedTuple):
    """What a package puts at one path of a prefix: kind "file" (sha256 None: presence only),
    "link" (target None: unknown) or "dir"; the mode bits its payload gives (None: unknown).
    A tuple: a torch env has 20,000 of them, made on every verify that finds a change."""

    kind: str
    package: str
    sha256: str | None = None
    mode: int | None = None
    target: str | None = None
    source: str | None = None  # the path in the package where the prefix's differs (noarch: python)
    also: tuple[str, ...] = ()  # the other packages that ship this path: rattler keeps any one of them in place
    also_sha256: tuple[str, ...] = ()  # their copies' sha256, which the one in place may have as well

    @property
    def sha256s(self) -> tuple[str, ...]:
        """Every content the path may hold."""
        return (self.sha256 or "", *self.also_sha256)


_KINDS = {"hardlink": "file", "softlink": "link", "directory": "dir"}


def expected_entries(name: str, body: dict, prefix: Path) -> Iterator[tuple[str, Expected]]:
    """(relative path, Expected) of every path a package's manifest lists."""
    in_prefix = body["in_prefix"].get(str(prefix), {})
    sources = body.get("sources", {})
    for path, kind, sha, placeholder, _file_mode, mode, target in body["paths"]:
        if kind == "hardlink" and sha and placeholder:
            sha = in_prefix.get(path, sha)
        yield path, Expected(_KINDS.get(kind, "file"), name, sha if kind == "hardlink" else None, mode, target,
                             sources.get(path))


def manifests_for(refs: list[PackageRef], prefix: Path, local: dict[str, Path] | None = None,
                  mirrors: Mirrors | None = None, extracted: dict[str, Path] | None = None) -> tuple[dict[str, dict], list[str]]:
    """{package name: manifest} for every package, and why any could not be had.

    Packages whose manifest is not yet trusted are fetched (from `local`, or the store, or
    their URL) and their sha256 compared with the one given, before anything is read from them.
    `extracted`: the package cache's copy of each package by file name (build_manifest)."""
    out: dict[str, dict] = {}
    missing = []
    stored: dict[str, dict] = {}  # genuine, but without this prefix's placeholder hashes
    for ref in refs:
        body = stored_manifest(ref.sha256)
        if body is not None and "paths" in body and _knows(body, ref.sha256, prefix):
            out[ref.name] = body
        else:
            missing.append(ref)
            if body is not None:
                stored[ref.sha256] = body
    problems: list[str] = []
    if missing:
        have = {r.file_name: local[r.file_name] for r in missing if local and r.file_name in local}
        try:
            fetched, bad = fetch_verified([r for r in missing if r.file_name not in have], store_dir(), mirrors,
                                          memo=ARCHIVE_DIGESTS)
        except ExtforgeError as exc:
            fetched, bad = {}, [exc.what]
        have.update(fetched)
        problems += [f"package archive not usable: {b}" for b in bad]
        for ref in missing:
            if ref.file_name in have:
                out[ref.name] = ensure_manifest(ref, have[ref.file_name], prefix, (extracted or {}).get(ref.file_name),
                                                stored.get(ref.sha256))
    noarch = sorted(name for name, body in out.items() if body.get("noarch_python") is not None)
    if noarch:
        python = python_minor(refs)
        if python is None:
            raise ExtforgeError(f"noarch: python package(s) {', '.join(noarch)} but no python in the environment",
                                "their files go into python's site-packages, which only python's version names",
                                "add python to the environment (the manifest's dependencies) and lock again")
        out |= {name: place_noarch_python(out[name], python, prefix) for name in noarch}
    return out, problems


def owned_paths(manifests: dict[str, dict]) -> set[str]:
    return {p[0] for body in manifests.values() for p in body["paths"]}

