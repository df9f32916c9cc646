"""`extforge verify PREFIX`: the check each node runs before jobs use an environment.

(a) packages: conda-meta records vs the lock (name, version, build, sha256);
(b) files: every installed file's sha256 vs its package's own paths.json, read from the
    package archive whose sha256 the lock names (trust.py) — never from conda-meta, which
    whoever can write the prefix can rewrite along with the files; drift or tampering is
    reported per file;
(c) import path: files on Python's import path that no package owns (.pth, sitecustomize,
    extra modules) are reported;
(d) admission: driver CUDA, GPU architectures, glibc (see admission.py).

A Slurm prolog cannot re-hash 5 GB on every job (10 s on an H100 node), so a run whose files all
hashed correctly records each file's (size, mtime, ctime, inode) in the user's private trust
folder, HMAC-keyed; the next run re-hashes only files whose record differs. mtime alone would
not do (it can be set back after an edit); ctime cannot be set by any user and changes with
every write, chmod or rename, so a same-size edit with a restored mtime is still re-hashed.
Files changed within a few seconds before a snapshot are never trusted from it (timestamps may
be coarse). --rehash ignores it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..machine import detect
from ..stamp import read_stamps
from .admission import Check, admission_checks
from .hashing import hash_many
from .mirrors import Mirrors
from .node import NodeFacts, probe
from .packages import locked_records, read_prefix_records, record_sha256
from .trust import PackageRef, expected_paths, manifests_for, owned_paths, read_signed, trust_dir, write_signed

# Findings are listed up to this many per check; the summary always has the full count.
MAX_FINDINGS = 200


@dataclass
class VerifyReport:
    prefix: Path
    checks: list[Check] = field(default_factory=list)
    node: NodeFacts | None = None
    files_hashed: int = 0
    bytes_hashed: int = 0
    files_unchanged: int = 0
    snapshot: str = "none"  # "written", "unwritable", "none" (not all files passed)
    bad_files: list[str] = field(default_factory=list)  # relative paths missing, unreadable or modified
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step, in order (-v prints them)

    @property
    def ok(self) -> bool:
        return all(c.verdict != "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FINDINGS

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict:
        return {
            "prefix": str(self.prefix),
            "ok": self.ok,
            "checks": [c.to_json() for c in self.checks],
            "node": self.node.to_json() if self.node else None,
            "files_hashed": self.files_hashed,
            "bytes_hashed": self.bytes_hashed,
            "files_unchanged_since_snapshot": self.files_unchanged,
            "snapshot": self.snapshot,
            "seconds": round(self.seconds, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
        }

    def lap(self, name: str, since: float) -> float:
        """Record the seconds of step `name` (begun at `since`); returns now, the next step's start."""
        now = time.monotonic()
        self.phases[name] = now - since
        return now




def check_packages(records: list[dict], locked: list | None, env: str | None, mirrors: Mirrors | None = None) -> Check:
    if locked is None:
        return Check("packages", "skip", "no lock given (--lock, --env)")

    mirrors = mirrors or Mirrors()
    have = {r["name"]: r for r in records}
    want = {r.name.normalized: r for r in locked}
    findings = [f"missing: {n} {w.version} {w.build}" for n, w in sorted(want.items()) if n not in have]
    findings += [f"not in the lock: {n} {have[n]['version']} {have[n]['build']}" for n in sorted(have) if n not in want]
    for n in sorted(set(have) & set(want)):
        h, w = have[n], want[n]
        expected = (str(w.version), str(w.build), record_sha256(w))
        got = (h["version"], h["build"], h.get("sha256", ""))
        if got != expected:
            findings.append(f"differs: {n} installed {got[0]} {got[1]} sha256 {got[2][:12]}…, locked {expected[0]} {expected[1]} sha256 {expected[2][:12]}…")
        elif h.get("url") and h["url"] not in (w.url, mirrors.redirect(w.url)):
            findings.append(f"origin: {n} came from {h['url']}, the lock names {w.url} (and no mirror of this site maps one to the other)")
    summary = f"{len(have)} installed vs {len(want)} locked in {env!r}"
    return Check("packages", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS]))


def package_refs(records: list[dict], locked: list | None) -> tuple[list[PackageRef], list[str]]:
    """The packages whose own paths.json the files are checked against: the lock's when given;
    otherwise those the prefix's records name (by sha256, so still only genuine packages)."""
    if locked is not None:
        return [PackageRef(r.name.normalized, r.file_name, r.url, record_sha256(r)) for r in locked], []
    refs, problems = [], []
    for r in records:
        if not (r.get("sha256") and r.get("url") and r.get("fn")):
            problems.append(f"unverifiable: {r.get('name')} (its record names no package sha256 and URL)")
        else:
            refs.append(PackageRef(r["name"], r["fn"], r["url"], r["sha256"]))
    return refs, problems


def expected_files(root: Path, manifests: dict[str, dict], prefix: Path) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """{relative path: (sha256, package)} of files to hash, and findings for entries checked
    without hashing (symbolic links: presence only)."""
    expect: dict[str, tuple[str, str]] = {}
    findings = []
    for name, body in manifests.items():
        for rel, sha in expected_paths(body, prefix):
            if sha is not None:
                expect[rel] = (sha, name)
            elif not os.path.lexists(os.path.join(root, rel)):
                findings.append(f"missing: {rel} ({name})")
    return expect, findings


# A file whose ctime is this close to the snapshot may have changed again within the same
# timestamp tick, unseen. Filesystems that keep sub-second times tick within milliseconds (the
# kernel's coarse clock); only those that keep whole seconds (some NFS servers) need seconds.
# A window of seconds on a fine filesystem made the first verify after an install (whose links
# are made in its last second) trust nothing, and the one after it re-hash everything again.
RACY_NS = 3 * 10**9
RACY_FINE_NS = 100 * 10**6
RECORD_SCHEMA = 2


def record_path(prefix: Path) -> Path:
    """Where the record of files unchanged since a clean run is kept: the user's private trust
    folder (HMAC-keyed), never the prefix, whose writers could otherwise vouch for their edits."""
    return trust_dir() / "verified" / f"{hashlib.sha256(str(prefix).encode()).hexdigest()[:32]}.json"


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _load_snapshot(prefix: Path) -> dict[str, list]:
    data = read_signed(record_path(prefix))
    if not data or data.get("schema") != RECORD_SCHEMA or data.get("prefix") != str(prefix):
        return {}
    taken = int(data.get("taken_ns", 0))
    files: dict[str, list] = data.get("files", {})
    # The record's own ctimes tell the filesystem's resolution: any sub-second part means fine.
    window = RACY_FINE_NS if any(e[3] % 10**9 for e in files.values()) else RACY_NS
    # Entries changed too close to the snapshot are left out: they must be hashed again.
    return {rel: e for rel, e in files.items() if e[3] < taken - window}


def _write_snapshot(prefix: Path, entries: dict[str, list], taken_ns: int) -> str:
    try:
        write_signed(record_path(prefix), {"schema": RECORD_SCHEMA, "prefix": str(prefix), "taken_ns": taken_ns, "files": entries})
    except OSError:
        return "unwritable"
    return "written"


def _unchanged(path: str, want: str, rel: str, snapshot: dict[str, list]) -> list[int] | None:
    """The file's stat key when it matches the snapshot (same sha256 expected, same stat)."""
    entry = snapshot.get(rel)
    if entry is None or entry[0] != want:
        return None
    try:
        key = _stat_key(os.stat(path))
    except OSError:
        return None
    return key if key == entry[1:] else None


def check_files(root: Path, manifests: dict[str, dict], threads: int | None, report: VerifyReport,
                *, rehash: bool = False, prefix: Path | None = None, problems: Sequence[str] = ()) -> Check:
    """Files under root vs the packages' manifests; root is the prefix itself, or install's
    staging folder that becomes `prefix`."""
    prefix = prefix or root
    expect, findings = expected_files(root, manifests, prefix)
    findings = [*problems, *findings]
    snapshot = {} if rehash else _load_snapshot(prefix)
    taken_ns = time.time_ns()
    entries: dict[str, list] = {}
    to_hash: dict[Path, list[int] | None] = {}
    base = str(root)
    # Plain strings here: pathlib costs more than the stat calls on a 20,000-file prefix.
    for rel, (want, _pkg) in expect.items():
        path = f"{base}/{rel}"
        key = _unchanged(path, want, rel, snapshot)
        if key is not None:
            entries[rel] = [want, *key]
            continue
        try:
            # Taken before hashing: a write during the hash changes ctime, so the next run re-hashes.
            to_hash[Path(path)] = _stat_key(os.stat(path))
        except OSError:
            to_hash[Path(path)] = None
    hashes = hash_many(to_hash, threads=threads)
    for hashed, got in sorted(hashes.items()):
        rel = str(hashed.relative_to(root))
        want, pkg = expect[rel]
        if not isinstance(got, str) or got != want:
            report.bad_files.append(rel)
        if isinstance(got, FileNotFoundError):
            findings.append(f"missing: {rel} ({pkg})")
        elif isinstance(got, OSError):
            findings.append(f"unreadable: {rel} ({pkg}): {got.strerror}")
        elif got != want:
            findings.append(f"modified: {rel} ({pkg}) sha256 {got[:12]}…, expected {want[:12]}…")
        elif (stat_key := to_hash[hashed]) is not None:
            entries[rel] = [want, *stat_key]
    report.files_hashed = len(hashes)
    report.files_unchanged = len(expect) - len(hashes)
    report.bytes_hashed = sum(k[0] for p, k in to_hash.items() if k is not None and isinstance(hashes[p], str))
    if not findings and hashes:
        report.snapshot = _write_snapshot(prefix, entries, taken_ns)
    summary = (f"{len(expect)} files from {len(manifests)} packages: {len(hashes)} hashed, "
               f"{report.files_unchanged} unchanged since verified; {len(findings)} problem(s)")
    return Check("files", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS]))


# Python runs these at every start, from any folder on sys.path (.pth only from site folders).
_STARTUP = {"sitecustomize", "usercustomize"}


def import_path_dirs(root: Path) -> list[Path]:
    """The prefix's folders on Python's default import path."""
    out = []
    for lib in sorted(root.glob("lib/python3*")):
        out += [d for d in (lib, lib / "lib-dynload", lib / "site-packages") if d.is_dir()]
    return out


def unowned_import_files(root: Path, owned: set[str]) -> list[str]:
    """Entries on Python's import path that no package installed: a .pth or sitecustomize runs
    code at every interpreter start, any other module can shadow a real one."""
    findings = []
    dirs = {str(d.relative_to(root)): d for d in import_path_dirs(root)}
    # What packages put directly in each folder: their files, and the folders they fill.
    top: dict[str, set[str]] = {d: set() for d in dirs}
    for o in owned:
        if o.startswith("lib/python3"):
            parts = o.split("/")
            for i in (2, 3):
                where = "/".join(parts[:i])
                if where in top and len(parts) > i:
                    top[where].add(parts[i])
    for where, d in dirs.items():
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            rel = f"{where}/{entry.name}"
            if entry.name == "__pycache__" or entry.name in ("lib-dynload", "site-packages"):
                continue  # written by Python itself for owned modules; the two folders are scanned themselves
            if entry.name in top[where]:
                continue
            stem = entry.name.split(".", 1)[0]
            why = ("runs code at every python start" if entry.name.endswith(".pth") or stem in _STARTUP
                   else "importable module")
            findings.append(f"not from any package: {rel} ({why})")
    return findings


def check_import_path(root: Path, manifests: dict[str, dict]) -> Check:
    owned = owned_paths(manifests)
    findings = unowned_import_files(root, owned)
    dirs = import_path_dirs(root)
    summary = (f"{len(dirs)} import folder(s): {len(findings)} entr{'y' if len(findings) == 1 else 'ies'} no package owns"
               if dirs else "no python in the prefix")
    return Check("import-path", "fail" if findings else ("pass" if dirs else "skip"), summary, tuple(findings[:MAX_FINDINGS]))


def verify_prefix(
    prefix: Path,
    *,
    lock_path: Path | None = None,
    env: str | None = None,
    node: NodeFacts | None = None,
    threads: int | None = None,
    rehash: bool = False,
    mirrors: Mirrors | None = None,
) -> VerifyReport:
    start = time.monotonic()
    prefix = prefix.resolve()
    report = VerifyReport(prefix=prefix)
    records = read_prefix_records(prefix)
    t = report.lap("conda-meta records", start)
    locked = None
    if lock_path is not None:
        if not env:
            raise ExtforgeError("--lock needs --env", "a lock holds several environments", "pass --env NAME")

        locked = locked_records(lock_path, env)
        t = report.lap("lock", t)
    report.checks.append(check_packages(records, locked, env, mirrors))
    t = report.lap("packages vs lock", t)
    refs, problems = package_refs(records, locked)
    manifests, fetch_problems = manifests_for(refs, prefix, mirrors=mirrors)
    t = report.lap("package manifests", t)
    report.checks.append(check_files(prefix, manifests, threads, report, rehash=rehash, problems=problems + fetch_problems))
    t = report.lap("file hashes", t)
    report.checks.append(check_import_path(prefix, manifests))
    t = report.lap("import path", t)
    env_cuda = next((r["version"] for r in records if r["name"] == "cuda-version"), None)
    audit_records = read_stamps(prefix)
    # The driver is asked only when a check needs it (NVML's init can take a second per GPU).
    report.node = node or (probe() if audit_records or env_cuda else NodeFacts(glibc=detect().glibc))
    t = report.lap("node probe", t)
    report.checks += admission_checks(audit_records, report.node, env_cuda)
    report.lap("admission", t)
    report.seconds = time.monotonic() - start
    return report
