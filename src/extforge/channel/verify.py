"""`extforge verify PREFIX`: the check each node runs before jobs use an environment.

(a) packages: conda-meta records vs the lock (name, version, build, sha256, and the URL it came
    from: the lock's, or where this site's mirrors redirect it);
(b) files: every installed file's sha256 vs its package's paths data (sha256_in_prefix for
    files whose prefix placeholder was rewritten at install time) — drift or tampering is
    reported per file;
(c) admission: driver CUDA, GPU architectures, glibc (see admission.py).
conda-meta is read as plain JSON and files are hashed on a thread pool with large reads.

A Slurm prolog cannot re-hash 5 GB on every job (10 s on an H100 node), so a run whose files all
hashed correctly records each file's (size, mtime, ctime, inode) in conda-meta/extforge/; the next
run re-hashes only files whose record differs. mtime alone would not do (it can be set back after
an edit); ctime cannot be set by any user and changes with every write, chmod or rename, so a
same-size edit with a restored mtime is still re-hashed. Files changed within a few seconds
before a snapshot are never trusted from it (timestamps may be coarse). --rehash ignores it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..audit.stamp import read_stamps
from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..machine import detect
from .admission import Check, admission_checks
from .hashing import hash_many
from .install import locked_records, read_prefix_records, record_sha256
from .mirrors import Mirrors
from .node import NodeFacts, probe

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


def expected_files(prefix: Path, records: list[dict]) -> tuple[dict[Path, tuple[str, str]], list[str]]:
    """{path: (sha256, package)} of files to hash, and findings for entries checked without hashing."""
    expect: dict[Path, tuple[str, str]] = {}
    findings = []
    for r in records:
        for e in r.get("paths_data", {}).get("paths", []):
            path = prefix / e["_path"]
            if e.get("path_type") == "softlink" or not (e.get("sha256_in_prefix") or e.get("sha256")):
                # Links and generated files (entry points) are checked for presence only.
                if not os.path.lexists(path):
                    findings.append(f"missing: {e['_path']} ({r['name']})")
                continue
            expect[path] = (e.get("sha256_in_prefix") or e["sha256"], r["name"])
    return expect, findings


SNAPSHOT = Path("conda-meta") / "extforge" / "verified-files.json"
# A file whose ctime is this close to the snapshot may have changed within the same timestamp tick.
RACY_NS = 3 * 10**9


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _load_snapshot(prefix: Path) -> dict[str, list]:
    try:
        data = json.loads((prefix / SNAPSHOT).read_bytes())
    except (OSError, ValueError):
        return {}
    if data.get("schema") != 1:
        return {}
    taken = int(data.get("taken_ns", 0))
    # Entries changed too close to the snapshot are left out: they must be hashed again.
    return {rel: e for rel, e in data.get("files", {}).items() if e[3] < taken - RACY_NS}


def _write_snapshot(prefix: Path, entries: dict[str, list], taken_ns: int) -> str:
    target = prefix / SNAPSHOT
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".verified-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"schema": 1, "taken_ns": taken_ns, "files": entries}, fh, separators=(",", ":"))
        os.replace(tmp, target)
    except OSError:
        # A node may see the prefix read-only (NFS); it then hashes every time, nothing breaks.
        return "unwritable"
    return "written"


def _unchanged(path: Path, want: str, rel: str, snapshot: dict[str, list]) -> list[int] | None:
    """The file's stat key when it matches the snapshot (same sha256 expected, same stat)."""
    entry = snapshot.get(rel)
    if entry is None or entry[0] != want:
        return None
    try:
        key = _stat_key(path.stat())
    except OSError:
        return None
    return key if key == entry[1:] else None


def check_files(prefix: Path, records: list[dict], threads: int | None, report: VerifyReport,
                *, rehash: bool = False) -> Check:
    expect, findings = expected_files(prefix, records)
    snapshot = {} if rehash else _load_snapshot(prefix)
    taken_ns = time.time_ns()
    entries: dict[str, list] = {}
    to_hash: dict[Path, list[int] | None] = {}
    for path, (want, _pkg) in expect.items():
        rel = str(path.relative_to(prefix))
        key = _unchanged(path, want, rel, snapshot)
        if key is not None:
            entries[rel] = [want, *key]
            continue
        try:
            # Taken before hashing: a write during the hash changes ctime, so the next run re-hashes.
            to_hash[path] = _stat_key(path.stat())
        except OSError:
            to_hash[path] = None
    hashes = hash_many(to_hash, threads=threads)
    for path, got in sorted(hashes.items()):
        want, pkg = expect[path]
        rel = str(path.relative_to(prefix))
        if isinstance(got, FileNotFoundError):
            findings.append(f"missing: {rel} ({pkg})")
        elif isinstance(got, OSError):
            findings.append(f"unreadable: {rel} ({pkg}): {got.strerror}")
        elif got != want:
            findings.append(f"modified: {rel} ({pkg}) sha256 {got[:12]}…, expected {want[:12]}…")
        elif (stat_key := to_hash[path]) is not None:
            entries[rel] = [want, *stat_key]
    report.files_hashed = len(hashes)
    report.files_unchanged = len(expect) - len(hashes)
    report.bytes_hashed = sum(k[0] for p, k in to_hash.items() if k is not None and isinstance(hashes[p], str))
    if not findings and hashes:
        report.snapshot = _write_snapshot(prefix, entries, taken_ns)
    summary = (f"{len(expect)} files from {len(records)} packages: {len(hashes)} hashed, "
               f"{report.files_unchanged} unchanged since verified; {len(findings)} problem(s)")
    return Check("files", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS]))


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
    report.checks.append(check_files(prefix, records, threads, report, rehash=rehash))
    t = report.lap("file hashes", t)
    env_cuda = next((r["version"] for r in records if r["name"] == "cuda-version"), None)
    audit_records = read_stamps(prefix)
    # The driver is asked only when a check needs it (NVML's init can take a second per GPU).
    report.node = node or (probe() if audit_records or env_cuda else NodeFacts(glibc=detect().glibc))
    t = report.lap("node probe", t)
    report.checks += admission_checks(audit_records, report.node, env_cuda)
    report.lap("admission", t)
    report.seconds = time.monotonic() - start
    return report
