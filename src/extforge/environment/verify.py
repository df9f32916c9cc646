"""`extforge verify PREFIX`: the check each node runs before jobs use an environment.

(a) packages: conda-meta records vs the lock (name, version, build, sha256). The lock is the
    one given (--lock, --env) or the one the prefix's install record names (receipt.py, a
    record its writers cannot forge); with neither, verify cannot vouch and says so (exit 1);
(b) files: every entry of the prefix accounted for (accounting.py): each installed file's
    sha256, kind, link target and mode vs its package's own paths.json and payload, read from
    the package archive whose sha256 the lock names (trust.py) — never from conda-meta, which
    whoever can write the prefix can rewrite along with the files;
(c) unowned: every entry no package, install record or tool accounts for (a planted .pyc, a
    library deep in site-packages, an activate.d script);
(d) admission: driver CUDA, GPU architectures, glibc (see admission.py).

A Slurm prolog cannot re-hash 5 GB on every job (10 s on an H100 node), so a run that found
nothing records each entry's (size, mtime, ctime, inode, mode) in the user's private trust
folder, HMAC-keyed; the next run re-hashes only files whose record differs, and re-lists only
folders whose record differs. mtime alone would not do (it can be set back after an edit);
ctime cannot be set by any user and changes with every write, chmod or rename, so a same-size
edit with a restored mtime is still re-hashed. Entries changed within a few seconds before a
snapshot are never trusted from it (timestamps may be coarse). --rehash ignores it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..hashing import RACY_FINE_NS, RACY_NS, file_key, hash_many
from ..paths import rattler_pkgs_dir
from .accounting import TOOL_FILES, expectations, unchanged, user_name, walk
from .admission import Check, admission_checks
from .extracted import Inode, Verified
from .mirrors import Mirrors
from .packages import locked_records, read_prefix_records
from .receipt import Pinned, find_receipt, receipt_path
from .trust import PackageRef, expected_entries, manifests_for, read_signed, trust_dir, write_signed

if TYPE_CHECKING:  # install imports this module for check_files, without the node's modules
    from .node import NodeFacts

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
    install_record: str = "none"  # "trusted", or why the prefix's install record is not believed

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
            "install_record": self.install_record,
            "seconds": round(self.seconds, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
        }

    def lap(self, name: str, since: float) -> float:
        """Record the seconds of step `name` (begun at `since`); returns now, the next step's start."""
        now = time.monotonic()
        self.phases[name] = now - since
        return now




def check_packages(records: list[dict], locked: list[Pinned], source: str, mirrors: Mirrors | None = None) -> Check:
    mirrors = mirrors or Mirrors()
    have = {r["name"]: r for r in records}
    want = {p.name: p for p in locked}
    findings = [f"missing: {n} {w.version} {w.build}" for n, w in sorted(want.items()) if n not in have]
    findings += [f"not in the lock: {n} {have[n]['version']} {have[n]['build']}" for n in sorted(have) if n not in want]
    for n in sorted(set(have) & set(want)):
        h, w = have[n], want[n]
        expected = (w.version, w.build, w.sha256)
        got = (h["version"], h["build"], h.get("sha256", ""))
        if got != expected:
            findings.append(f"differs: {n} installed {got[0]} {got[1]} sha256 {got[2][:12]}…, locked {expected[0]} {expected[1]} sha256 {expected[2][:12]}…")
        elif h.get("url") and h["url"] not in (w.url, mirrors.redirect(w.url)):
            findings.append(f"origin: {n} came from {h['url']}, the lock names {w.url} (and no mirror of this site maps one to the other)")
    summary = f"{len(have)} installed vs {len(want)} locked in {source}"
    return Check("packages", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS]))


# What check_files expects at a path: the sha256s it may hold, the package named in findings,
# and each shipping package's mode bits for it (where its payload gives them).
Wanted = tuple[tuple[str, ...], str, tuple[tuple[str, int], ...]]


def expected_files(root: Path, manifests: dict[str, dict], prefix: Path) -> tuple[dict[str, Wanted], list[str]]:
    """{relative path: Wanted} of files to hash, and findings for entries checked without
    hashing (symbolic links: presence only). A path several packages ship may hold any one's
    copy: rattler keeps one of them in place, not always the last one's. The manifests' rows are
    read as they are (trust.expected_paths's rule, inline: a torch env has 25,000 of them)."""
    expect: dict[str, Wanted] = {}
    findings = []
    for name, body in manifests.items():
        in_prefix = body["in_prefix"].get(str(prefix), {})
        for rel, kind, sha, placeholder, _file_mode, mode, _target in body["paths"]:
            if kind != "hardlink" or not sha:
                if not os.path.lexists(os.path.join(root, rel)):
                    findings.append(f"missing: {rel} ({name})")
                continue
            if placeholder:
                sha = in_prefix.get(rel, sha)
            modes = () if mode is None else ((name, mode),)
            if rel in expect:
                shas, _, more = expect[rel]
                expect[rel] = ((sha, *shas), name, more + modes)
            else:
                expect[rel] = ((sha,), name, modes)
    return expect, findings


# 4: every entry of the prefix (folders and links too) by its lstat key, for one basis.
# 5: a path of python's interpreter that another package ships too holds python's copy only.
RECORD_SCHEMA = 5
_CTIME = 2  # index of ctime in a record entry [size, mtime, ctime, inode, mode]


def record_path(prefix: Path) -> Path:
    """Where the record of files unchanged since a clean run is kept: the user's private trust
    folder (HMAC-keyed), never the prefix, whose writers could otherwise vouch for their edits."""
    return trust_dir() / "verified" / f"{hashlib.sha256(str(prefix).encode()).hexdigest()[:32]}.json"


def record_basis(prefix: Path, locked: list[Pinned], written: dict[str, list], record_names: Sequence[str]) -> str:
    """What a record's entries were checked against: the same packages, install record and tool
    files give the same expectations, so an entry as recorded is still as expected."""
    basis = [str(prefix), sorted(p.sha256 for p in locked), sorted(written.items()), sorted(record_names), sorted(TOOL_FILES)]
    return hashlib.sha256(json.dumps(basis).encode()).hexdigest()


def load_snapshot(prefix: Path, basis: str) -> tuple[dict[str, list], set[str], int]:
    """The last clean run's entries, those of them old enough to be believed, and how many of
    them are files checked by hash."""
    data = read_signed(record_path(prefix))
    if not data or data.get("schema") != RECORD_SCHEMA or data.get("prefix") != str(prefix) or data.get("basis") != basis:
        return {}, set(), 0
    taken = int(data.get("taken_ns", 0))
    entries: dict[str, list] = data.get("entries", {})
    # The record's own ctimes tell the filesystem's resolution: any sub-second part means fine.
    window = RACY_FINE_NS if any(e[_CTIME] % 10**9 for e in entries.values()) else RACY_NS
    # Entries changed too close to the snapshot are not believed: they are hashed (folders listed) again.
    return entries, {rel for rel, e in entries.items() if e[_CTIME] < taken - window}, int(data.get("hashed_files", 0))


def write_snapshot(prefix: Path, basis: str, entries: dict[str, list], hashed_files: int, taken_ns: int) -> str:
    try:
        write_signed(record_path(prefix), {"schema": RECORD_SCHEMA, "prefix": str(prefix), "basis": basis, "taken_ns": taken_ns,
                                           "hashed_files": hashed_files, "entries": entries})
    except OSError:
        return "unwritable"
    return "written"


def _hash_and_compare(root: Path, want: dict[str, tuple[tuple[str, ...], str]], keys: dict[str, list[int] | None],
                      threads: int | None, report: VerifyReport) -> tuple[list[str], dict[str, tuple[list[int], str]]]:
    """Hash the files `keys` names (relative to root) against `want`; findings, and the key and
    sha256 of each file that hashed right."""
    base = str(root)
    paths = {Path(f"{base}/{rel}"): rel for rel in keys}
    hashes = hash_many(paths, threads=threads)
    findings: list[str] = []
    good: dict[str, tuple[list[int], str]] = {}
    for hashed, got in sorted(hashes.items()):
        rel = paths[hashed]
        shas, pkg = want[rel]
        if not isinstance(got, str) or got not in shas:
            report.bad_files.append(rel)
        if isinstance(got, FileNotFoundError):
            findings.append(f"missing: {rel} ({pkg})")
        elif isinstance(got, OSError):
            findings.append(f"unreadable: {rel} ({pkg}): {got.strerror}")
        elif got not in shas:
            others = f" (or another package's copy: {len(shas) - 1} more)" if len(shas) > 1 else ""
            findings.append(f"modified: {rel} ({pkg}) sha256 {got[:12]}…, expected {shas[0][:12]}…{others}")
        elif (k := keys[rel]) is not None:
            good[rel] = (k, got)
    report.files_hashed = len(hashes)
    report.bytes_hashed = sum(k[0] for rel, k in keys.items() if k is not None and rel in good)
    return findings, good


_S_IFMT, _S_IFREG = 0o170000, stat.S_IFREG


def check_files(root: Path, manifests: dict[str, dict], threads: int | None, report: VerifyReport,
                *, prefix: Path | None = None, trusted: Mapping[Inode, Verified] | None = None,
                ) -> tuple[Check, dict[str, tuple[os.stat_result, str]], dict[str, tuple[os.stat_result, str]]]:
    """Every file the packages list under root (install's staging folder that becomes `prefix`):
    a regular file of this user's, its bytes hashed unless it is an inode of the package cache
    verified before (`trusted`, by device and inode: extracted.recall) with the size, mtime and
    mode it had then and a sha256 expected at its path, and its mode. Files are hard links into
    the package cache, whose modes are shared too: a chmod in another prefix is a chmod of the
    cache's copy. The check, and the files found as expected, {path: (its lstat, sha256)}: those
    `trusted` vouched for, and those hashed."""
    expect, findings = expected_files(root, manifests, prefix or root)
    uid = os.geteuid()
    trusted = trusted or {}
    found: dict[str, tuple[os.stat_result, str]] = {}
    seen: dict[str, os.stat_result] = {}
    to_hash: dict[str, list[int] | None] = {}
    base, lstat = f"{root}/", os.lstat  # 25,000 files at every install: the loop kept lean
    for rel, (shas, pkg, modes) in expect.items():
        try:
            st = lstat(base + rel)
        except OSError:
            to_hash[rel] = None  # the hash says what is wrong
            continue
        st_mode = st.st_mode
        if st_mode & _S_IFMT != _S_IFREG or st.st_uid != uid:
            what = "not a regular file" if not stat.S_ISREG(st_mode) else f"owned by {user_name(st.st_uid)}"
            findings.append(f"replaced: {rel} is {what}, {pkg} has a file of the installing user's there")
            report.bad_files.append(rel)
            continue
        seen[rel] = st
        known = trusted.get((st.st_dev, st.st_ino))
        if known is not None and known[2] == st_mode and known[1] == st.st_mtime_ns and known[0] == st.st_size and known[3] in shas:
            found[rel] = (st, known[3])
        else:
            to_hash[rel] = file_key(st)
        for name, mode in modes:
            if st_mode & 0o7777 & ~mode:
                findings.append(f"mode widened: {rel} is {st_mode & 0o7777:04o}, {name} gives {mode:04o}")
                report.bad_files.append(rel)
    hashed, good = _hash_and_compare(root, {rel: expect[rel][:2] for rel in to_hash}, to_hash, threads, report)
    findings += hashed
    summary = f"{len(expect)} files from {len(manifests)} packages: {len(findings)} problem(s)"
    return (Check("files", "fail" if findings else "pass", summary, tuple(findings[:MAX_FINDINGS])), found,
            {rel: (seen[rel], sha) for rel, (_, sha) in good.items()})


@dataclass
class Accounting:
    """What check_prefix compares the prefix with, and the record of the last clean run."""

    written: dict[str, list]  # files install wrote and recorded (receipt.py)
    record_names: list[str]  # conda-meta/<name>.json of each locked package
    basis: str
    previous: dict[str, list]
    trusted: set[str]
    hashed_files: int  # how many of the recorded entries are files checked by hash
    linked: dict[str, str]  # package name: its folder in the package cache its files are hard links of


def check_prefix(prefix: Path, manifests: dict[str, dict], report: VerifyReport, acc: Accounting, *,
                 threads: int | None = None, problems: Sequence[str] = ()) -> tuple[Check, Check]:
    """Every entry of the prefix accounted for (accounting.py), every owned file's sha256: the
    "files" check (what packages or install put there) and the "unowned" one (everything else)."""
    entries = {name: list(expected_entries(name, body, prefix)) for name, body in manifests.items()}
    expect, absent_ok = expectations(entries, acc.written, acc.record_names)
    taken_ns = time.time_ns()
    found = walk(str(prefix), expect, absent_ok, acc.previous, acc.trusted, acc.linked)
    want = {rel: (expect[rel].sha256s, expect[rel].package) for rel in found.to_hash}
    hashed, good = _hash_and_compare(prefix, want, dict(found.to_hash), threads, report)
    found.record.update({rel: k for rel, (k, _) in good.items()})
    findings = [*problems, *found.owned, *hashed]
    report.files_unchanged = found.unchanged
    # Unknown packages leave their files unaccounted for: those are not planted, just unknown.
    unowned = [] if problems else found.unowned
    if not findings and not unowned and (found.to_hash or found.listed):
        report.snapshot = write_snapshot(prefix, acc.basis, found.record, found.unchanged + len(good), taken_ns)
    n_files = sum(e.kind == "file" for e in expect.values())
    files = Check("files", "fail" if findings else "pass",
                  f"{n_files} files from {len(manifests)} packages and install: {report.files_hashed} hashed, "
                  f"{found.unchanged} unchanged since verified; {len(findings)} problem(s)",
                  tuple(findings[:MAX_FINDINGS]))
    summary = (f"{len(found.record)} entries walked ({found.listed} folder(s) read): "
               f"{len(unowned)} entr{'y' if len(unowned) == 1 else 'ies'} no package or install record accounts for"
               if not problems else "not checked: the files of some packages are unknown (see files)")
    other = Check("unowned", "fail" if unowned or problems else "pass", summary, tuple(unowned[:MAX_FINDINGS]))
    return files, other


def all_unchanged(report: VerifyReport, hashed_files: int, entries: int) -> list[Check]:
    """The checks of a prefix whose every entry is as the last clean run recorded it."""
    report.files_unchanged = hashed_files
    return [Check("files", "pass", f"{hashed_files} files unchanged since verified, 0 hashed; 0 problem(s)"),
            Check("unowned", "pass", f"{entries} entries as recorded (0 folder(s) read): 0 entries no package "
                                     "or install record accounts for")]


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
    from ..machine import detect
    from ..stamp import read_stamps
    from .node import NodeFacts, probe

    start = time.monotonic()
    try:
        prefix = prefix.resolve()
    except (OSError, RuntimeError) as exc:  # 3.11 raises RuntimeError for a symlink loop
        raise ExtforgeError(f"prefix {prefix} cannot be resolved", str(exc), "pass the environment's folder, "
                            "not a path through symbolic-link loops") from None
    if not prefix.is_dir():
        what = "is a file, not an environment's folder" if prefix.exists() else "does not exist"
        raise ExtforgeError(f"{prefix} {what}", "verify checks the folder an environment was installed into",
                            "pass the folder given to `extforge install --prefix`")
    report = VerifyReport(prefix=prefix)
    records = read_prefix_records(prefix)
    t = report.lap("conda-meta records", start)
    receipt, why_not = find_receipt(prefix)
    if lock_path is not None:
        if not env:
            raise ExtforgeError("--lock needs --env", "a lock holds several environments", "pass --env NAME")
        locked = [Pinned.from_record(r) for r in locked_records(lock_path, env)]
        source = repr(env)
    elif receipt is not None:
        locked, source = receipt.packages, f"{receipt.environment!r} of {receipt.lock} (install record)"
    else:
        raise ExtforgeError(
            f"cannot vouch for {prefix}: {why_not}",
            "without the lock it was installed from, only the prefix's own conda-meta names its packages, "
            "and whoever can write the prefix can rewrite that",
            f"run `extforge verify {prefix} --env NAME --lock PATH/pixi.lock` with the lock it was installed from "
            f"(`extforge install` leaves a record at {receipt_path(prefix)}, or in the prefix, that verify trusts when only its owner can write it)",
            exit_code=EXIT_FINDINGS,
        )
    report.install_record = "trusted" if receipt is not None else why_not
    t = report.lap("lock", t)
    report.checks.append(check_packages(records, locked, source, mirrors))
    t = report.lap("packages vs lock", t)
    # What install wrote (byte code) is vouched for by its record only when that record is of this lock.
    same_lock = receipt is not None and {p.sha256 for p in receipt.packages} == {p.sha256 for p in locked}
    written = receipt.written if receipt is not None and same_lock else {}
    record_names = [p.file_name.removesuffix(".conda").removesuffix(".tar.bz2") for p in locked]
    basis = record_basis(prefix, locked, written, record_names)
    previous, trusted, hashed_files = ({}, set(), 0) if rehash else load_snapshot(prefix, basis)
    cache = receipt.cache if receipt is not None and receipt.cache else str(rattler_pkgs_dir(create=False))
    linked = {p.name: f"{cache}/{name}" for p, name in zip(locked, record_names, strict=True)}
    acc = Accounting(written, record_names, basis, previous, trusted, hashed_files, linked)
    t = report.lap("record of the last clean run", t)
    if unchanged(str(prefix), previous, trusted):
        report.checks += all_unchanged(report, acc.hashed_files, len(acc.previous))
        t = report.lap("every entry as recorded", t)
    else:
        refs = [PackageRef(p.name, p.file_name, p.url, p.sha256, p.size or None) for p in locked]
        manifests, fetch_problems = manifests_for(refs, prefix, mirrors=mirrors)
        t = report.lap("package manifests", t)
        report.checks += check_prefix(prefix, manifests, report, acc, threads=threads, problems=fetch_problems)
        t = report.lap("every entry and file hash", t)
    env_cuda = next((r["version"] for r in records if r["name"] == "cuda-version"), None)
    try:
        audit_records = read_stamps(prefix)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # unreadable or damaged: a finding, not a crash
        audit_records = []
        report.checks.append(Check("audit-records", "fail", f"the extension audit records in the prefix cannot be read: {exc}"))
    # The driver is asked only when a check needs it (NVML's init can take a second per GPU).
    report.node = node or (probe() if audit_records or env_cuda else NodeFacts(glibc=detect().glibc))
    t = report.lap("node probe", t)
    report.checks += admission_checks(audit_records, report.node, env_cuda)
    report.lap("admission", t)
    report.seconds = time.monotonic() - start
    return report
