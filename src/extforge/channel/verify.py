"""`extforge verify PREFIX`: the check each node runs before jobs use an environment.

(a) packages: conda-meta records vs the lock (name, version, build, sha256);
(b) files: every installed file's sha256 vs its package's paths data (sha256_in_prefix for
    files whose prefix placeholder was rewritten at install time) — drift or tampering is
    reported per file;
(c) admission: driver CUDA, GPU architectures, glibc (see admission.py).
conda-meta is read as plain JSON and files are hashed on a thread pool with large reads, so
a 5 GB torch environment verifies in seconds (bench/verify_bench.py). Every file is re-hashed
on every run: trusting size+mtime would miss same-size edits made with a restored mtime.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from .admission import Check, admission_checks, read_audit_records
from .hashing import hash_many
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
    seconds: float = 0.0

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
            "seconds": round(self.seconds, 3),
        }


def read_prefix_records(prefix: Path) -> list[dict]:
    meta = prefix / "conda-meta"
    if not meta.is_dir():
        raise ExtforgeError(f"{prefix} is not a conda environment", "it has no conda-meta folder", "pass the prefix given to `extforge install`")
    return [json.loads(p.read_bytes()) for p in sorted(meta.glob("*.json"))]


def check_packages(records: list[dict], locked: list | None, env: str | None) -> Check:
    if locked is None:
        return Check("packages", "skip", "no lock given (--lock, --env)")
    from .install import record_sha256

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


def check_files(prefix: Path, records: list[dict], threads: int | None, report: VerifyReport) -> Check:
    expect, findings = expected_files(prefix, records)
    hashes = hash_many(expect, threads=threads)
    for path, (want, pkg) in sorted(expect.items()):
        got = hashes[path]
        rel = path.relative_to(prefix)
        if isinstance(got, FileNotFoundError):
            findings.append(f"missing: {rel} ({pkg})")
        elif isinstance(got, OSError):
            findings.append(f"unreadable: {rel} ({pkg}): {got.strerror}")
        elif got != want:
            findings.append(f"modified: {rel} ({pkg}) sha256 {got[:12]}…, expected {want[:12]}…")
    report.files_hashed = len(expect)
    report.bytes_hashed = sum(p.stat().st_size for p, h in hashes.items() if isinstance(h, str))
    summary = f"{len(expect)} files hashed from {len(records)} packages, {len(findings)} problem(s)"
    return Check("files", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS]))


def verify_prefix(
    prefix: Path,
    *,
    lock_path: Path | None = None,
    env: str | None = None,
    node: NodeFacts | None = None,
    threads: int | None = None,
) -> VerifyReport:
    start = time.monotonic()
    prefix = prefix.resolve()
    report = VerifyReport(prefix=prefix)
    records = read_prefix_records(prefix)
    locked = None
    if lock_path is not None:
        if not env:
            raise ExtforgeError("--lock needs --env", "a lock holds several environments", "pass --env NAME")
        from .install import locked_records

        locked = locked_records(lock_path, env)
    report.checks.append(check_packages(records, locked, env))
    report.checks.append(check_files(prefix, records, threads, report))
    report.node = node or probe()
    env_cuda = next((r["version"] for r in records if r["name"] == "cuda-version"), None)
    report.checks += admission_checks(read_audit_records(prefix), report.node, env_cuda)
    report.seconds = time.monotonic() - start
    return report
