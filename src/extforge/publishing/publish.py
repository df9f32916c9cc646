"""Publish packages to a channel folder (atomic, locked, logged) or upload them to a server.

A channel folder is usually on NFS, written by several publishers and read by many solvers
at once. Under an exclusive POSIX lock (fcntl.lockf, which NFS forwards to the server's lock
manager) a publisher: removes leftovers of publishers that died, refuses a package identity
(name-version-build) that exists with other bytes in any subdir or format and any package the
re-index could not read, copies each package to a temp name, fsyncs, renames it into place,
re-indexes (index.reindex replaces repodata atomically, rebuilding a damaged one) and appends
to the publish log. A refusal or a failed re-index leaves the channel as it was; a SIGKILL at
any point leaves the old or the new state plus temp files the next publish removes.

The channel is shared by a Unix group (docs/site-admin.md): every file extforge writes there
goes through safe_files (never through a planted symlink, group-readable whatever the umask).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from .. import engine
from ..archive import check_package
from ..audit import audit_package
from ..channel_ref import channel_url, local_folder
from ..errors import ExtforgeError
from ..hashing import sha256_file
from ..locking import exclusive
from ..safe_files import append, atomic_writer, make_dir, make_dirs, read_bytes, remove_quietly, truncate
from .index import REPODATA_LIMIT, TEMP_PREFIX, is_package_file, reindex, remove_leftovers, require_readable, subdirs
from .names import file_stem, identity_problems

LOCK_NAME = f"{TEMP_PREFIX}publish.lock"
LOG_NAME = "publish-log.jsonl"
# Server kinds reachable through py-rattler-build's upload functions, written as a URL prefix.
SERVERS = engine.UPLOAD_KINDS


@dataclass(frozen=True)
class AuditGate:
    verdict: str  # the audit's verdict, or "not-audited" when no audit ran
    ok: bool
    report: dict | None = None


@dataclass
class PublishedPackage:
    file: str
    subdir: str
    sha256: str
    status: str  # "published" | "already-present" | "uploaded"
    audit: str
    audit_override: str | None = None


@dataclass
class PublishResult:
    channel: str
    packages: list[PublishedPackage] = field(default_factory=list)
    leftovers_removed: int = 0
    log_repaired: list[str] = field(default_factory=list)  # package files the log lacked (a killed run)
    repodata_rebuilt: list[str] = field(default_factory=list)  # subdirs whose repodata.json was damaged
    ignored: list[str] = field(default_factory=list)  # "subdir/file: why": files in the channel not served
    # "swapped: …", "deleted: …": published files changed or removed since the publish log recorded them
    changed_behind: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # the channel folder (and the folders above it) this run made
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def audit_gate(path: Path, upstream: list[str]) -> AuditGate:
    """Run extforge's binary audit on a package against the torch it pins, taken from `upstream`."""

    report = audit_package(path, channel=upstream)
    return AuditGate(str(report.verdict), bool(report.ok), report.to_json())


def channel_lock(channel: Path) -> AbstractContextManager[None]:
    return exclusive(channel / LOCK_NAME)


def _copy_in(src: Path, dest: Path) -> str:
    """Copy to a temp name next to dest, fsync, rename; return the sha256 of what was copied."""
    # rattler-build writes 0600; every node of the cluster must be able to read the channel.
    with atomic_writer(dest, mode=0o644, tmp_prefix=TEMP_PREFIX.removeprefix(".") + "tmp-") as out:
        return sha256_file(src, copy_to=out)


def _append_log(channel: Path, entries: list[dict]) -> int:
    """Append entries to the publish log; return its size before, to undo the append."""
    return append(channel / LOG_NAME, "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries).encode())


def _log_entry(file: str, digest: str, status: str, audit: str, override: str | None) -> dict:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "file": file,
        "sha256": digest,
        "status": status,
        "audit": audit,
        "audit_override": override,
    }


# A publish log bigger than this is no log (a channel's log grows ~300 bytes per package).
LOG_LIMIT = 1 << 30


def logged(channel: Path) -> dict[str, dict]:
    """`subdir/file`: the publish log's last entry for it (torn lines skipped). The log is read
    without following a link, and a FIFO or device in its place is refused, not waited on."""
    try:
        text = read_bytes(channel / LOG_NAME, limit=LOG_LIMIT).decode(errors="replace")
    except FileNotFoundError:
        return {}
    entries: dict[str, dict] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            entries[str(entry["file"])] = entry
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return entries


def logged_files(channel: Path) -> set[str]:
    """`subdir/file` of every package the publish log has an entry for."""
    return set(logged(channel))


@dataclass(frozen=True)
class Served:
    """A subdir's regular package files (a link or a FIFO under a package name is no package
    of the channel: never opened) and what its repodata.json says of them."""

    files: dict[str, os.stat_result]  # name: lstat
    indexed: dict[str, dict]  # name: repodata entry
    indexed_ns: int  # when repodata.json was written (0: none)


def _served(root: Path, sd: str) -> Served:
    files = {}
    for entry in os.scandir(root / sd):
        if is_package_file(entry.name) and entry.is_file(follow_symlinks=False):
            files[entry.name] = entry.stat(follow_symlinks=False)
    try:
        path = root / sd / "repodata.json"
        indexed_ns = path.lstat().st_mtime_ns
        repodata = json.loads(read_bytes(path, limit=REPODATA_LIMIT))
        indexed = {**repodata.get("packages", {}), **repodata.get("packages.conda", {})}
    except (OSError, ValueError, AttributeError, TypeError, RecursionError, ExtforgeError):
        indexed, indexed_ns = {}, 0  # damaged: the re-index rebuilds it and says so
    return Served(files, indexed, indexed_ns)


def _channel_state(root: Path) -> dict[str, Served]:
    return {sd: _served(root, sd) for sd in subdirs(root) if (root / sd).is_dir() and not (root / sd).is_symlink()}


def _repair_entries(root: Path, state: dict[str, Served], log: dict[str, dict]) -> list[dict]:
    """Log entries for the package files the log lacks, to write before the re-index serves
    them: those a killed publisher copied in but did not log ("recovered"), or, in a channel
    without a log yet, those another tool put there ("adopted")."""
    status = "recovered" if os.path.lexists(root / LOG_NAME) else "adopted"
    entries = []
    for sd, served in state.items():
        for name in sorted(served.files):
            if f"{sd}/{name}" not in log:
                digest = (served.indexed.get(name) or {}).get("sha256") or sha256_file(root / sd / name)
                entries.append(_log_entry(f"{sd}/{name}", digest, status, "unknown", None))
    return entries


# The log's status for a published file found deleted (with the sha256 it was published with):
# later publishes do not report it again.
GONE = "gone"


@dataclass
class Behind:
    """What changed in the channel behind the publish log's back."""

    findings: list[str] = field(default_factory=list)  # one line each, for the output
    withheld: dict[str, str] = field(default_factory=dict)  # swapped files not to serve: {subdir/file: why}
    gone: list[dict] = field(default_factory=list)  # log entries of deleted files, so they are reported once


def _changed_behind(root: Path, state: dict[str, Served], log: dict[str, dict]) -> Behind:
    """Logged packages swapped for other bytes (left out of the index) or deleted since their
    publish.

    A file is hashed only when it may have changed since its subdir was indexed: its ctime
    (which no user can set back) is newer, its size differs, or it was never indexed."""
    out = Behind()
    for rel, entry in sorted(log.items()):
        sd, _, name = rel.partition("/")
        served = state.get(sd)
        by = f"published by {entry.get('user', '?')} at {entry.get('time', '?')}"
        if served is None or name not in served.files:
            # Reported once, by the publish that logged it gone; if it comes back, its bytes are checked.
            if entry.get("status") != GONE and served is not None and not os.path.lexists(root / rel):
                out.findings.append(f"deleted: {rel} ({by}) is gone from the channel")
                out.gone.append(_log_entry(rel, str(entry.get("sha256", "")), GONE, "unknown", None))
            continue
        st, record = served.files[name], served.indexed.get(name) or {}
        if st.st_ctime_ns < served.indexed_ns and st.st_size == record.get("size") and record.get("sha256") == entry.get("sha256"):
            continue
        digest = sha256_file(root / rel)
        if digest != entry.get("sha256"):
            why = (f"its bytes (sha256 {digest[:12]}…) are not those {by} (sha256 {str(entry.get('sha256'))[:12]}…): "
                   "replaced behind the channel's back; not served")
            out.findings.append(f"swapped: {rel}: {why}")
            out.withheld[rel] = why
    return out


def parse_channel(channel: Path | str) -> tuple[str, str]:
    """("folder", path) or (server kind, https URL) from what the user passed as --channel.

    A server is named by a prefix on its URL (quetz+https://host/channel); prefix.dev URLs
    are recognised as they are. Plain http(s) URLs are rejected: a folder served over HTTP
    is read-only, publish to the folder itself.
    """
    text = str(channel)
    scheme, _, rest = text.partition("+")
    if rest and scheme in SERVERS:
        return scheme, rest
    url = urlparse(text)
    if url.scheme == "file":
        return "folder", str(local_folder(text))
    if url.scheme in ("http", "https"):
        if url.hostname == "prefix.dev":
            return "prefix", text
        raise ExtforgeError(
            f"cannot publish to {text}",
            "a channel folder served over HTTP is read-only, and no server kind was named",
            "publish to the folder path the HTTP server serves, or name the server: "
            + ", ".join(f"{s}+https://HOST/CHANNEL" for s in SERVERS),
        )
    return "folder", text


def _upload(kind: str, url: str, files: list[Path]) -> None:
    parsed = urlparse(url)
    channel_name = parsed.path.rstrip("/").rsplit("/", 1)[-1]
    server = f"{parsed.scheme}://{parsed.netloc}"
    api_key = os.environ.get("EXTFORGE_UPLOAD_API_KEY")
    try:
        engine.upload(kind, files, server, channel_name, api_key)
    except Exception as exc:  # rattler_build.UploadError and network errors
        raise ExtforgeError(
            f"upload to {url} failed",
            str(exc),
            "check the URL and credentials (EXTFORGE_UPLOAD_API_KEY or rattler's auth file)",
        ) from exc


def publish(
    packages: list[Path],
    channel: Path | str,
    *,
    allow_audit_failure: str | None = None,
    audit: bool = True,
    upstream: Sequence[str] = (),
) -> PublishResult:
    """Publish `packages` after their audit; `upstream` are the channels their pinned dependencies
    (pytorch) come from, defaulting to the target channel itself when it is a folder."""
    start = time.monotonic()
    packages = [Path(p).resolve() for p in packages]
    for p in packages:
        if not p.is_file():
            raise ExtforgeError(f"package {p} not found", "", "pass the paths of built packages")
        if not is_package_file(p.name):
            raise ExtforgeError(f"{p.name} is not a package file name", "a channel serves *.conda and *.tar.bz2 files whose names do not start with '.'", "pass the package files rattler-build wrote")
    # The subdir, the identity and every path the packages name are checked before anything is written.
    subdir_of = {p: _checked_subdir(p) for p in packages}

    kind, where = parse_channel(channel)
    upstream = [channel_url(u) for u in upstream]
    if not upstream and kind == "folder" and Path(where).is_dir():
        upstream = [channel_url(where)]
    gates: dict[Path, AuditGate] = {}
    for p in packages:
        gate = audit_gate(p, upstream) if audit else AuditGate("skipped", True)
        if not gate.ok and not allow_audit_failure:
            raise ExtforgeError(
                f"package {p.name} failed its audit (verdict {gate.verdict})",
                "a package that fails the binary audit can crash or mis-run on the cluster",
                "fix the build; or publish anyway with --allow-audit-failure \"<reason>\" (logged)",
                exit_code=1,
            )
        gates[p] = gate

    result = PublishResult(channel=str(channel))
    if kind != "folder":
        _upload(kind, where, packages)
        for p in packages:
            result.packages.append(
                PublishedPackage(p.name, subdir_of[p], sha256_file(p), "uploaded", gates[p].verdict, _override(gates[p], allow_audit_failure))
            )
        result.seconds = time.monotonic() - start
        return result

    root = Path(where).resolve()
    result.created = [str(p) for p in _make_channel_folder(root)]
    planned = [(p, subdir_of[p], sha256_file(p)) for p in packages]
    with channel_lock(root):
        result.leftovers_removed = len(remove_leftovers(root))
        # Check the whole batch before writing anything: a refusal leaves the channel as it was.
        require_readable(root)
        state = _channel_state(root)
        present = _refuse_identity_clashes(root, state, planned)
        seen = logged(root)
        behind = _changed_behind(root, state, seen)
        result.changed_behind = behind.findings
        log = _repair_entries(root, state, seen)
        result.log_repaired = [e["file"] for e in log]
        log += behind.gone
        copied: list[Path] = []
        made = [root / sd for sd in sorted({sd for _, sd, _ in planned}) if not (root / sd).exists()]
        had_log = os.path.lexists(root / LOG_NAME)
        log_size: int | None = None  # the log's size before this run's append, once appended
        try:
            for p, subdir, digest in planned:
                dest = root / subdir / p.name
                status = "already-present" if (subdir, p.name) in present else "published"
                if status == "published":
                    make_dir(dest.parent, like=root)
                    copied.append(dest)
                    _copy_in(p, dest)
                override = _override(gates[p], allow_audit_failure)
                result.packages.append(PublishedPackage(p.name, subdir, digest, status, gates[p].verdict, override))
                log.append(_log_entry(f"{subdir}/{p.name}", digest, status, gates[p].verdict, override))
            # Logged before the re-index serves them: the log never lacks a served package.
            # One append, so a failed re-index undoes the repair entries with ours.
            log_size = _append_log(root, log)
            reindexed = reindex(root, behind.withheld)
            result.repodata_rebuilt, result.ignored = reindexed.rebuilt, reindexed.ignored
        except BaseException:
            _undo(root, copied, made, log_size, had_log)
            raise
    result.seconds = time.monotonic() - start
    return result


def _make_channel_folder(root: Path) -> list[Path]:
    """Create the channel folder where it is missing; the folders made. Below a setgid folder
    (a site's group folder, docs/site-admin.md) each new one takes its group bits, so every
    member can publish into the channel whatever the creator's umask; elsewhere the umask rules."""
    missing = []
    here = root
    while not os.path.lexists(here):
        missing.append(here)
        here = here.parent
    for path in reversed(missing):
        if os.stat(path.parent).st_mode & stat.S_ISGID:
            make_dir(path)
        else:
            make_dirs(path)
    return missing[::-1]


def _undo(root: Path, copied: list[Path], made: list[Path], log_size: int | None, had_log: bool) -> None:
    """Put the channel back as it was after a failed copy or re-index: the packages this run
    copied in, the subdirs it made, and its log append (log_size: the size before it)."""
    for path in [*copied, *made]:
        remove_quietly(path, beneath=root)
    if log_size is not None and had_log:
        truncate(root / LOG_NAME, log_size)
    elif log_size is not None:
        remove_quietly(root / LOG_NAME, beneath=root)


def _checked_subdir(path: Path) -> str:
    """The package's subdir, after its paths and its identity passed conda's rules."""
    meta = check_package(path)
    problems = identity_problems(meta.name, meta.version, meta.build)
    expected = f"{meta.name}-{meta.version}-{meta.build}"
    if not problems and file_stem(path.name) != expected:
        problems.append(f"its file name says {file_stem(path.name)!r} but its index.json says {expected!r}")
    if problems:
        raise ExtforgeError(
            f"package {path.name} has an identity a channel cannot serve",
            "; ".join(problems),
            "fix package.name, package.version or build.string in the recipe and rebuild",
            exit_code=1,
        )
    return meta.subdir


def _refuse_identity_clashes(root: Path, state: dict[str, Served], planned: list[tuple[Path, str, str]]) -> set[tuple[str, str]]:
    """(subdir, file) of the planned packages already in the channel with the same bytes;
    ExtforgeError when a planned identity (name-version-build) is in the channel, or twice in
    the batch, as another file: another subdir, the other format, or other bytes."""
    on_disk: dict[str, list[tuple[str, str]]] = {}
    for sd, served in state.items():
        for name in served.files:
            if stem := file_stem(name):
                on_disk.setdefault(stem, []).append((sd, name))
    present: set[tuple[str, str]] = set()
    claimed: dict[str, tuple[str, str, str]] = {}
    for p, subdir, digest in planned:
        stem = file_stem(p.name) or p.name
        if claimed.setdefault(stem, (subdir, p.name, digest)) != (subdir, p.name, digest):
            raise ExtforgeError(
                f"two packages of this publish are {stem}, with other bytes",
                "a channel serves one file per package identity (name-version-build)",
                "publish one of them; bump the build number of the other",
                exit_code=1,
            )
        for sd, name in on_disk.get(stem, []):
            if (sd, name) == (subdir, p.name) and sha256_file(root / sd / name) == digest:
                present.add((sd, name))
                continue
            raise ExtforgeError(
                f"{stem} is already in {root} as {sd}/{name}"
                + (" with different content" if (sd, name) == (subdir, p.name) else ""),
                "a published package identity (name-version-build) is immutable in every subdir and format: "
                "nodes and lock files that saw the old bytes would break, and a solver could pick either file",
                "bump the build number (recipe build.number) and rebuild",
                exit_code=1,
            )
    return present


def _override(gate: AuditGate, reason: str | None) -> str | None:
    return reason if (reason and not gate.ok) else None
