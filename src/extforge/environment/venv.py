"""`extforge verify VENV --lock pylock.toml`: a pip or uv virtual environment checked against
the pylock.toml it was installed from, with the conda side's rule (verify.py): nothing in the
environment is evidence, since whoever can write a file there can rewrite its RECORD line too.

(a) packages: each `*.dist-info` in site-packages against the lock (name, version). Installers
    record no wheel hash for an index install (pip's direct_url.json exists for direct URLs
    only), so the wheel is identified by its contents: (b).
(b) files: the locked wheel is fetched (its sha256 checked against the lock, kept in extforge's
    store) and its own RECORD read; every file it ships must be in the venv with that sha256,
    where an installer puts it (purelib/platlib into site-packages, `.data/scripts` into bin/
    with its `#!python` line naming the venv's python, headers and data by the wheel
    spec's scheme). What the installer writes itself (RECORD, INSTALLER, REQUESTED,
    direct_url.json, uv's uv_cache.json, entry-point launchers in bin/) is held to the venv's
    RECORD hash and, for launchers, to the wheel's entry_points.txt and the venv's python.
    Byte code (`__pycache__/*.pyc`, which pip lists in RECORD without a hash and Python writes
    after install) is compiled again from its source by the venv's own python and compared as
    code objects (marshal bytes are not stable between runs): a .pyc that is not its source's
    is a finding, whoever wrote it.
(c) unowned: every other entry of the venv, except the venv's own files (pyvenv.cfg, the
    interpreter links, the activation scripts), named with why it matters: a `.pth` runs at
    every python start, a `.py`/`.pyc`/`.so` in site-packages is importable, bin/ is on PATH.

pip's own distribution (and setuptools up to Python 3.11), which `python -m venv` seeds into
every venv it makes, is no finding when the lock lacks it: its files are held to its own RECORD (self-consistency only) and the
summary names it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from ..errors import EXIT_FINDINGS, ExtforgeError
from ..hashing import file_key, hash_many
from ..safe_files import read_bytes
from .accounting import key, unchanged
from .admission import Check
from .packages import fetch_verified, store_dir
from .pylock import LockedWheel, PyLock, read_pylock
from .trust import read_signed, trust_dir, write_signed
from .verify import MAX_FINDINGS, VerifyReport, all_unchanged, load_snapshot, write_snapshot

# Distributions `python -m venv` puts into every venv (ensurepip; setuptools up to Python 3.11):
# not in a lock, not planted.
SEEDED = {"pip", "setuptools"}
# What installers write into a dist-info folder themselves (never run).
INSTALLER_FILES = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"}
# The files `python -m venv` and `uv venv` write (the interpreter links are checked to lead to
# pyvenv.cfg's home): scripts a user runs by name, none that python runs at start.
VENV_FILES = {"pyvenv.cfg", "bin/activate", "bin/activate.csh", "bin/activate.fish", "bin/Activate.ps1",
              ".gitignore", "CACHEDIR.TAG", "bin/activate.bat", "bin/activate.nu", "bin/activate.ps1",
              "bin/activate.xsh", "bin/activate_this.py", "bin/deactivate.bat", "bin/pydoc.bat"}
# uv's lock of the venv while it installs: an empty file, accepted only while it is empty.
UV_LOCK = ".lock"
METADATA_LIMIT = 64 * 1024 * 1024
_PYC = re.compile(r"(?P<stem>[^/]+)\.(?P<tag>[a-z]+-\d+)(?:\.opt-(?P<opt>[12]))?\.pyc$")
MANIFEST_SCHEMA = 1


def is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file()


@dataclass(frozen=True)
class WheelFile:
    """A file of a wheel as its own RECORD lists it, and where an installer puts it."""

    path: str  # relative to the venv
    sha256: str | None  # hex
    script: bool = False  # a .data/scripts file whose `#!python` line the installer rewrites


@dataclass
class Installed:
    """One `*.dist-info` of site-packages."""

    name: str
    version: str
    dist_info: str  # relative to the venv
    record: dict[str, str | None] = field(default_factory=dict)  # venv-relative path -> sha256 hex (None: no hash)


def record_hex(value: str) -> str | None:
    """RECORD's `sha256=<urlsafe base64>` as hex; None for an empty or other-algorithm entry."""
    algorithm, _, digest = value.partition("=")
    if algorithm != "sha256" or not digest:
        return None
    try:
        return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    except ValueError:
        return None


def parse_record(text: str, base: PurePosixPath) -> dict[str, str | None]:
    """RECORD rows as {venv-relative path: sha256 hex or None}; base: the folder paths are relative to."""
    out: dict[str, str | None] = {}
    for row in csv.reader(io.StringIO(text)):
        if row and row[0]:
            out[_join(base, row[0])] = record_hex(row[1]) if len(row) > 1 else None
    return out


def _join(base: PurePosixPath, rel: str) -> str:
    return os.path.normpath(str(base / rel))


def site_packages(venv: Path) -> PurePosixPath:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise ExtforgeError(f"{venv} has {len(found)} lib/python3.X/site-packages folders", "a venv has exactly one",
                            "pass the venv made by `python -m venv` that pip or uv installed into")
    return PurePosixPath(found[0].relative_to(venv))


def _metadata(text: str) -> tuple[str, str]:
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line and not line.startswith(" "))
    return fields.get("Name", ""), fields.get("Version", "")


def installed(venv: Path, site: PurePosixPath) -> list[Installed]:
    dists = []
    for info in sorted((venv / site).glob("*.dist-info")):
        rel = PurePosixPath(site) / info.name
        try:
            name, version = _metadata(read_bytes(info / "METADATA", limit=METADATA_LIMIT).decode("utf-8", "replace"))
            record = read_bytes(info / "RECORD", limit=METADATA_LIMIT).decode("utf-8", "replace")
        except (OSError, ExtforgeError) as exc:
            raise ExtforgeError(f"{venv / rel} is not a readable installed distribution", str(exc),
                                "the venv was damaged or edited: install it again from the lock into a new venv",
                                exit_code=EXIT_FINDINGS) from None
        dists.append(Installed(canonicalize_name(name), version, str(rel), parse_record(record, site)))
    return dists


def wheel_files(archive: Path, site: PurePosixPath, dist_name: str, python_short: str) -> tuple[list[WheelFile], list[str]]:
    """The files of a verified wheel where an installer puts them, and its console/gui scripts."""
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
        record_name = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise ExtforgeError(f"{archive.name} has no .dist-info/RECORD", "every wheel lists its files there",
                                "rebuild the wheel with a standard build backend")
        record = zf.read(record_name).decode("utf-8", "replace")
        entry_name = record_name.replace("/RECORD", "/entry_points.txt")
        entry_points = zf.read(entry_name).decode("utf-8", "replace") if entry_name in names else ""
        shebangs = {n for n in names if ".data/scripts/" in n and zf.read(n)[:8] == b"#!python"}
    data_dir = record_name.split(".dist-info/")[0] + ".data/"
    scheme = {"purelib": site, "platlib": site, "scripts": PurePosixPath("bin"), "data": PurePosixPath("."),
              "headers": PurePosixPath("include/site") / f"python{python_short}" / dist_name}
    files = []
    for row in csv.reader(io.StringIO(record)):
        if not row or not row[0] or row[0] == record_name:
            continue
        path, sha = row[0], record_hex(row[1]) if len(row) > 1 else None
        if path.startswith(data_dir):
            key, _, rest = path[len(data_dir):].partition("/")
            files.append(WheelFile(_join(scheme.get(key, PurePosixPath(".")), rest), sha, path in shebangs))
        else:
            files.append(WheelFile(_join(site, path), sha))
    return files, _script_names(entry_points)


def _script_names(text: str) -> list[str]:
    names, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section in ("console_scripts", "gui_scripts"):
            names.append(line.split("=", 1)[0].strip())
    return names


def _manifest(wheel: LockedWheel, archive: Path, site: PurePosixPath, python_short: str) -> dict:
    """The wheel's files by where they install, kept signed in the user's trust folder by its
    sha256 (a torch wheel's RECORD is read once, not at every verify)."""
    path = trust_dir() / "manifests" / f"{wheel.sha256}.wheel-py{python_short}.json"
    body = read_signed(path)
    if body and body.get("schema") == MANIFEST_SCHEMA:
        return body
    files, scripts = wheel_files(archive, site, wheel.name, python_short)
    body = {"schema": MANIFEST_SCHEMA, "files": [[f.path, f.sha256, f.script] for f in files], "scripts": scripts}
    write_signed(path, body)
    return body


@dataclass
class Expectations:
    hashes: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (sha256 hex, distribution)
    scripts: dict[str, tuple[str, str]] = field(default_factory=dict)  # bin/ files an installer rewrote or wrote
    owned: set[str] = field(default_factory=set)  # every path a distribution accounts for
    pyc: dict[str, str] = field(default_factory=dict)  # byte code -> its source
    findings: list[str] = field(default_factory=list)


def _expect_locked(exp: Expectations, dist: Installed, manifest: dict) -> None:
    from_wheel = set()
    for path, sha, script in manifest["files"]:
        from_wheel.add(path)
        exp.owned.add(path)
        if script:
            exp.scripts[path] = (dist.record.get(path) or "", dist.name)
        elif sha:
            exp.hashes[path] = (sha, dist.name)
        else:
            exp.findings.append(f"unverifiable: {path} ({dist.name}): the wheel's RECORD gives it no sha256")
    launchers = {f"bin/{n}" for n in manifest["scripts"]}
    for path, sha in dist.record.items():
        if path in from_wheel:
            continue
        name = PurePosixPath(path)
        if str(name.parent) == dist.dist_info and name.name in INSTALLER_FILES:
            exp.owned.add(path)
            if sha:
                exp.hashes[path] = (sha, dist.name)
        elif path in launchers:
            exp.owned.add(path)
            exp.scripts[path] = (sha or "", dist.name)
        elif name.suffix != ".pyc":  # byte code is checked against its source wherever it lies
            exp.owned.add(path)  # named here once, not again as unowned
            exp.findings.append(f"not from the wheel: {path} ({dist.name}): the venv's RECORD lists it, the locked "
                                "wheel does not ship it")


def _expect_seeded(exp: Expectations, dist: Installed) -> None:
    for path, sha in dist.record.items():
        if path.endswith(".pyc"):
            continue
        exp.owned.add(path)
        if sha:
            (exp.scripts if path.startswith("bin/") else exp.hashes)[path] = (sha, dist.name)


def check_venv_packages(dists: list[Installed], lock: PyLock) -> tuple[Check, list[Installed], list[Installed]]:
    """The packages check, and the installed distributions whose files are checked against their
    locked wheel, and against their own RECORD (seeded by the venv)."""
    have = {d.name: d for d in dists}
    findings = [f"missing: {n} {w.version}" for n, w in sorted(lock.packages.items()) if n not in have]
    seeded = [d for n, d in sorted(have.items()) if n not in lock.packages and n in SEEDED]
    findings += [f"not in the lock: {n} {d.version}" for n, d in sorted(have.items()) if n not in lock.packages and n not in SEEDED]
    matched = []
    for n in sorted(set(have) & set(lock.packages)):
        if have[n].version != lock.packages[n].version:
            findings.append(f"differs: {n} installed {have[n].version}, locked {lock.packages[n].version}")
        else:
            matched.append(have[n])
    extra = f"; {', '.join(f'{d.name} {d.version}' for d in seeded)} seeded by the venv" if seeded else ""
    summary = f"{len(have)} installed vs {len(lock.packages)} locked in {lock.path.name}{extra}"
    return Check("packages", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS])), matched, seeded


def _python_short(site: PurePosixPath) -> str:
    return site.parts[1].removeprefix("python")


_PYC_CHECK = r"""
import importlib.util, json, marshal, sys
bad = []
for pyc, src, opt in json.load(sys.stdin):
    try:
        with open(pyc, "rb") as fh:
            data = fh.read()
        if data[:4] != importlib.util.MAGIC_NUMBER:
            bad.append([pyc, "it is byte code of another Python version"])
            continue
        with open(src, "rb") as fh:
            want = compile(fh.read(), src, "exec", dont_inherit=True, optimize=opt)
        if marshal.loads(data[16:]) != want:
            bad.append([pyc, "its code is not its source's"])
    except Exception as exc:
        bad.append([pyc, "it cannot be read as byte code of its source (%s)" % type(exc).__name__])
print(json.dumps(bad))
"""


def check_bytecode(venv: Path, pairs: dict[str, str]) -> list[str]:
    """Each .pyc compiled again from its source by the venv's python (-I -S: nothing of the venv
    runs), compared as code objects."""
    if not pairs:
        return []
    jobs = []
    for pyc, src in sorted(pairs.items()):
        m = _PYC.search(pyc)
        jobs.append([str(venv / pyc), str(venv / src), int(m.group("opt") or 0) if m else 0])
    python = venv / "bin" / "python"
    try:
        proc = subprocess.run([str(python), "-I", "-S", "-c", _PYC_CHECK], input=json.dumps(jobs), capture_output=True,
                              text=True, timeout=3600)
        bad = json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return [f"byte code not checked: the venv's python {python} did not run ({exc})"]
    return [f"byte code: {os.path.relpath(pyc, venv)}: {why}" for pyc, why in bad]


def _why(rel: str, site: str) -> str:
    name = PurePosixPath(rel)
    if name.suffix == ".pth":
        return "a .pth file: runs at every python start"
    if name.suffix == ".pyc":
        return "byte code: imported in place of its module" if name.parent.name == "__pycache__" else "byte code: importable"
    if rel.startswith("bin/"):
        return "on PATH when the venv is active"
    if rel.startswith(site) and name.suffix in (".py", ".so"):
        return "an importable module"
    if ".so" in name.suffixes:
        return "a shared library"
    return "no locked wheel ships it"


def _interpreter_link(venv: Path, rel: str) -> bool:
    """bin/python, python3, python3.X: links to the interpreter pyvenv.cfg's home names."""
    if not re.fullmatch(r"bin/python(3(\.\d+)?)?", rel):
        return False
    try:
        cfg = dict(line.split("=", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if "=" in line)
        home = Path(cfg.get("home", "").strip()).resolve()
        target = (venv / rel).resolve()
    except (OSError, ValueError, RuntimeError):
        return False
    return os.path.islink(venv / rel) and (target.parent == home or target == (venv / "bin" / "python").resolve())


def walk_unowned(venv: Path, exp: Expectations, site: PurePosixPath) -> list[str]:
    # The folders of owned files, and those `python -m venv` makes (include/python3.X stays empty).
    folders = {str(p) for path in [*exp.owned, f"{site}/x", f"include/python{_python_short(site)}/x"]
               for p in PurePosixPath(path).parents}
    unowned = []
    for top, dirs, files in os.walk(venv):
        rel_top = os.path.relpath(top, venv)
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            rel = os.path.normpath(os.path.join(rel_top, name))
            if rel in exp.owned or rel in VENV_FILES or _interpreter_link(venv, rel):
                continue
            if rel == UV_LOCK and os.lstat(venv / rel).st_size == 0 and not os.path.islink(venv / rel):
                continue
            if rel.startswith(f"{site}/") and PurePosixPath(rel).parent.name == "__pycache__" and rel.endswith(".pyc"):
                continue  # byte code of site-packages: checked against its source (_bytecode_of)
            if rel == "lib64" and os.readlink(venv / rel) == "lib":
                continue
            unowned.append(f"unowned: {rel} ({_why(rel, str(site))})")
        for d in list(dirs):
            rel = os.path.normpath(os.path.join(rel_top, d))
            if os.path.islink(os.path.join(top, d)):
                dirs.remove(d)
            elif rel not in folders and rel not in exp.owned and rel != "bin" and not rel.endswith("__pycache__"):
                unowned.append(f"unowned: {rel}/ (a folder no locked wheel ships)")
                dirs.remove(d)
    return unowned


def _bytecode_of(venv: Path, site: PurePosixPath, owned: set[str]) -> tuple[dict[str, str], list[str]]:
    """Every .pyc in a __pycache__ of site-packages beside its owned source; findings for the others."""
    pairs, orphans = {}, []
    for pyc in sorted((venv / site).rglob("__pycache__/*.pyc")):
        rel = str(pyc.relative_to(venv))
        m = _PYC.search(pyc.name)
        source = str(PurePosixPath(rel).parent.parent / f"{m.group('stem')}.py") if m else ""
        if m and source in owned:
            pairs[rel] = source
        else:
            orphans.append(f"unowned: {rel} (byte code of no module a locked wheel ships: imported in place of one)")
    return pairs, orphans


def venv_basis(venv: Path, lock: PyLock) -> str:
    """What a clean run's record of the venv was checked against: the locked wheels and the
    interpreter the venv runs (outside it, where bin/python leads), which compiles its byte code
    for the check."""
    try:
        python = file_key(os.stat(venv / "bin" / "python"))
    except OSError:
        python = []
    basis = ["venv", str(venv), sorted(w.sha256 for w in lock.packages.values()), python, sorted(SEEDED)]
    return hashlib.sha256(json.dumps(basis).encode()).hexdigest()


def _entries(venv: Path) -> dict[str, list]:
    """Every entry of the venv (folders, files, links, the venv itself) by its lstat key."""
    base = len(str(venv)) + 1
    out = {".": key(os.lstat(venv))}
    for top, dirs, files in os.walk(venv):
        rel = top[base:]
        for name in (*dirs, *files):
            out[f"{rel}/{name}" if rel else name] = key(os.lstat(os.path.join(top, name)))
    return out


def verify_venv(venv: Path, lock_path: Path | None, *, threads: int | None = None, rehash: bool = False) -> VerifyReport:
    """A run that found nothing records every entry's lstat key, as verify_prefix does; the next
    run (the venv's every entry as recorded, the same lock and interpreter) reads no file and
    runs no python, only the packages check (`rehash`: every file is read again)."""
    start = time.monotonic()
    venv = venv.resolve()
    if lock_path is None:
        raise ExtforgeError(
            f"cannot vouch for {venv}: a venv keeps no record of the lock it was installed from",
            "its own RECORD files name its files, and whoever can write the venv can rewrite those",
            f"run `extforge verify {venv} --lock pylock.ENV.toml` with the lock it was installed from",
            exit_code=EXIT_FINDINGS,
        )
    report = VerifyReport(prefix=venv)
    lock = read_pylock(lock_path)
    site = site_packages(venv)
    short = _python_short(site)
    dists = installed(venv, site)
    t = report.lap("installed distributions and the lock", start)
    packages, matched, seeded = check_venv_packages(dists, lock)
    report.checks.append(packages)
    basis = venv_basis(venv, lock)
    previous, trusted, hashed_files = ({}, set(), 0) if rehash else load_snapshot(venv, basis)
    if unchanged(str(venv), previous, trusted):
        report.checks += all_unchanged(report, hashed_files, len(previous))
        report.lap("every entry as recorded", t)
        report.seconds = time.monotonic() - start
        return report
    # Taken before anything is read: an entry changed after its key was taken is not believed next time.
    taken_ns = time.time_ns()
    entries = _entries(venv)
    archives, bad = fetch_verified([lock.packages[d.name] for d in matched], store_dir())
    t = report.lap("locked wheels", t)
    exp = Expectations(findings=[f"wheel differs from the lock: {b}" for b in bad])
    for dist in matched:
        wheel = lock.packages[dist.name]
        if wheel.file_name in archives:
            _expect_locked(exp, dist, _manifest(wheel, archives[wheel.file_name], site, short))
    for dist in seeded:
        _expect_seeded(exp, dist)
    want = {Path(venv, rel): (rel, sha, owner) for rel, (sha, owner) in (exp.hashes | exp.scripts).items()}
    hashes = hash_many(want, threads=threads)
    findings = list(exp.findings)
    python_line = f"#!{venv / 'bin' / 'python'}".encode()
    for path, got in sorted(hashes.items()):
        rel, sha, owner = want[path]
        if isinstance(got, FileNotFoundError):
            findings.append(f"missing: {rel} ({owner})")
        elif isinstance(got, OSError):
            findings.append(f"unreadable: {rel} ({owner}): {got.strerror}")
        elif got != sha:
            findings.append(f"modified: {rel} ({owner}) sha256 {got[:12]}…, expected {sha[:12] or 'none'}…")
        elif rel in exp.scripts and not read_bytes(path, limit=METADATA_LIMIT).startswith(python_line):
            findings.append(f"modified: {rel} ({owner}): its first line does not run the venv's python")
    report.files_hashed = len(hashes)
    t = report.lap("file hashes", t)
    exp.pyc, orphans = _bytecode_of(venv, site, exp.owned)
    findings += check_bytecode(venv, exp.pyc)
    t = report.lap("byte code", t)
    report.checks.append(Check("files", "fail" if findings else "pass",
                               f"{len(exp.hashes) + len(exp.scripts)} files from {len(matched) + len(seeded)} "
                               f"distributions and {len(exp.pyc)} byte-code files: {len(findings)} problem(s)",
                               tuple(findings[:MAX_FINDINGS])))
    unowned = orphans + walk_unowned(venv, exp, site)
    report.checks.append(Check("unowned", "fail" if unowned else "pass",
                               f"{len(unowned)} entr{'y' if len(unowned) == 1 else 'ies'} no locked wheel or installer "
                               "accounts for", tuple(unowned[:MAX_FINDINGS])))
    t = report.lap("every entry", t)
    if report.ok:
        report.snapshot = write_snapshot(venv, basis, entries, len(exp.hashes) + len(exp.scripts), taken_ns)
        report.lap("record of this clean run", t)
    report.seconds = time.monotonic() - start
    return report
