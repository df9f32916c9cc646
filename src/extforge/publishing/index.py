"""Re-index a channel folder with rattler so readers only ever see complete repodata.

rattler's indexer writes repodata.json in place. Readers on other nodes (solvers, installers)
may read while we write, so we index a shadow copy of the channel (the package files, plus
the current repodata.json so indexing stays incremental) and rename each finished
repodata.json over the live one: a reader sees the old file or the new one.

Anyone who can write the channel folder can put a file there. A package file rattler cannot
read (junk, a truncated copy) would make its indexer panic and fail every publish; it is left
out of the shadow instead, so it is not served, and named to whoever re-indexes.

A channel is shared by a Unix group: the shadow hard-links only the files this user owns
(Linux's fs.protected_hardlinks refuses links to another user's file) and clones or copies
the others; a package nobody in the group can read is named before anything changes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from .. import safe_files
from ..archive import package_tars
from ..channel_ref import REPODATA_LIMIT
from ..errors import ExtforgeError
from ..hashing import fsync_dir
from ..safe_files import make_dir
from ..ui import log

# Every channel needs these two even when empty; conda clients ask for both.
REQUIRED_SUBDIRS = ("noarch", "linux-64")
TEMP_PREFIX = ".extforge-"
PACKAGE_SUFFIXES = (".conda", ".tar.bz2")


def is_package_file(name: str) -> bool:
    return name.endswith(PACKAGE_SUFFIXES) and not name.startswith(".")


# A platform subdir is noarch or <os>-<arch>: a build output folder also holds rattler-build's
# work folders (bld/, src_cache/), which are no subdirs of the channel.
SUBDIR_PATTERN = re.compile(r"^(noarch|[a-z]+-[a-z0-9]+)$")


def subdirs(channel: Path) -> list[str]:
    found = {p.name for p in channel.iterdir() if p.is_dir() and SUBDIR_PATTERN.match(p.name)}
    return sorted(found | set(REQUIRED_SUBDIRS))


def remove_leftovers(channel: Path) -> list[Path]:
    """Delete temp files and shadow index folders of publishers that died mid-way.

    Only call this while holding the publish lock: then no live publisher owns them.
    """
    removed = []
    top = safe_files.names(channel)
    candidates = [channel / n for n in top if n.startswith(f"{TEMP_PREFIX}index-")]
    for sd in top:
        if SUBDIR_PATTERN.match(sd) and (channel / sd).is_dir() and not (channel / sd).is_symlink():
            candidates += [channel / sd / n for n in safe_files.names(channel / sd, beneath=channel)
                           if n.startswith(f"{TEMP_PREFIX}tmp-")]
    for path in candidates:
        safe_files.remove_quietly(path, beneath=channel)
        removed.append(path)
    return removed


def index_fs(folder: Path) -> None:
    """rattler's indexer, in a child process: py-rattler 0.28 leaves runtime threads behind
    that abort the interpreter at exit about every other time (SIGABRT/SIGSEGV after
    "PyGILState_Release ... finalizing"), which would turn a finished publish into a crash."""
    # The child dies with its parent (PR_SET_PDEATHSIG): an indexer orphaned by a SIGKILLed
    # publisher went on writing into the shadow folder after the next publish removed it.
    code = (
        "import asyncio, ctypes, os, signal, sys; "
        "ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
        "os.getppid() == int(sys.argv[2]) or os._exit(3); "
        "from rattler.index import index_fs; "
        "asyncio.run(index_fs(sys.argv[1], write_zst=False, write_shards=False)); sys.stdout.flush(); "
        "os._exit(0)"
    )
    # cwd given: the caller's may be gone (a build outliving its checkout), and a Python
    # started in a deleted directory fails before running any code.
    proc = subprocess.run([sys.executable, "-c", code, str(folder), str(os.getpid())], capture_output=True, text=True,
                          cwd=folder)
    if proc.returncode != 0:
        raise ExtforgeError(
            f"could not index the channel folder {folder}",
            (proc.stderr.strip().splitlines() or [f"the indexer exited with {proc.returncode}"])[-1],
            "check that the folder is writable and holds only valid .conda/.tar.bz2 packages",
        )


def carry_fresh_entries(live: Path, dest: Path) -> set[str] | None:
    """The subdir's repodata.json without the entries of files rewritten since it was written,
    written to `dest`; returns the file names carried, or None (nothing carried, so the indexer
    rebuilds every entry) when it is damaged.

    rattler's indexer keeps every entry it finds and indexes only new file names, so a package
    rewritten in place under the same name (the audit stamps built packages after rattler-build
    indexed them) would keep its old sha256, and a lock taken from the channel would then refuse
    the file."""
    repodata = live / "repodata.json"
    carried: set[str] = set()
    try:
        written = repodata.lstat().st_mtime_ns
        data = json.loads(safe_files.read_bytes(repodata, limit=REPODATA_LIMIT))
        for key in ("packages", "packages.conda"):
            entries = data.get(key) or {}
            for name in list(entries):
                if not is_package_file(name) or "/" in name:
                    raise ValueError(f"entry {name!r} is no package file of this folder")
                try:
                    st = (live / name).lstat()
                except OSError:
                    continue  # gone: the indexer drops it
                # ctime too: an edit whose mtime was set back still moves it (no user can set it).
                if max(st.st_mtime_ns, st.st_ctime_ns) >= written or st.st_size != entries[name].get("size"):
                    del entries[name]
                else:
                    carried.add(name)
    except (OSError, ValueError, AttributeError, TypeError, RecursionError, ExtforgeError):
        # Empty, truncated, a JSON list, entries that are no objects, nested too deep to parse,
        # a link or a FIFO in its place: nothing in it is trusted.
        return None
    safe_files.write_atomic(dest, json.dumps(data).encode())
    return carried


def _index_json_problem(tar: tarfile.TarFile) -> str | None:
    for member in tar:
        if member.name == "info/index.json":
            raw = tar.extractfile(member)
            data = json.loads(raw.read(1 << 20)) if raw else None
            if not isinstance(data, dict) or not {"name", "version", "build"} <= data.keys():
                return "its info/index.json names no name, version and build"
            return None
    return "it holds no info/index.json"


def unindexable(path: Path) -> str | None:
    """Why rattler's indexer could not read this package's info/index.json, or None. Only the
    info part is read (for a .tar.bz2, up to info/index.json, which conda tools write first)."""
    try:
        for tar in package_tars(path, "info"):
            return _index_json_problem(tar)
        return "it holds no info-*.tar.zst"
    except (zipfile.BadZipFile, tarfile.TarError, zstandard.ZstdError, EOFError, OSError, ValueError) as exc:
        return f"it is not a readable package ({type(exc).__name__}: {exc})"


def unreadable_packages(channel: Path) -> list[str]:
    """`subdir/file` of every package this user cannot read (the re-index must copy them)."""
    found = []
    for sd in subdirs(channel):
        if not (channel / sd).is_dir():
            continue
        for entry in os.scandir(channel / sd):
            if is_package_file(entry.name) and not os.access(entry.path, os.R_OK):
                found.append(f"{sd}/{entry.name}")
    return sorted(found)


def require_readable(channel: Path) -> None:
    unreadable = unreadable_packages(channel)
    if unreadable:
        raise ExtforgeError(
            f"cannot read {len(unreadable)} package(s) in {channel}: {', '.join(unreadable)}",
            "re-indexing reads every package of the channel, and these are not readable by you or your group "
            "(another publisher's umask, or a file put there by hand)",
            f"ask their owner to run `chmod a+r` on them, or `chgrp -R GROUP {channel} && chmod -R g+rX {channel}` "
            "(docs/site-admin.md: a shared channel)",
        )


def _shadow_entry(entry: os.DirEntry, dest: Path) -> None:
    if entry.stat(follow_symlinks=False).st_uid == os.geteuid():
        safe_files.hard_link(Path(entry.path), dest)
    else:
        safe_files.clone(Path(entry.path), dest)  # the shadow must not alias a file another user owns


@dataclass
class Reindexed:
    rebuilt: list[str] = field(default_factory=list)  # subdirs whose damaged repodata.json was rebuilt
    ignored: list[str] = field(default_factory=list)  # "subdir/file: why": package files not served


def reindex(channel: Path, withheld: dict[str, str] | None = None) -> Reindexed:
    """Index every subdir of a channel folder and atomically replace its repodata.json files.

    A subdir's repodata.json that is damaged (empty, truncated, not an object) is rebuilt from
    the package files; a package file the indexer could not read is left out (not served), and
    so is each of `withheld` ({subdir/file: why}, files publish found swapped)."""
    withheld = withheld or {}
    shadow = channel / f"{TEMP_PREFIX}index-{os.getpid()}"
    safe_files.remove_quietly(shadow)
    done = Reindexed()
    try:
        names = subdirs(channel)
        make_dir(shadow, like=channel)
        for sd in names:
            live = channel / sd
            make_dir(live, like=channel)
            # group bits too: another member removes what a killed publisher left here
            make_dir(shadow / sd, like=channel)
            carried: set[str] = set()
            if (live / "repodata.json").exists():
                fresh = carry_fresh_entries(live, shadow / sd / "repodata.json")
                if fresh is None:
                    done.rebuilt.append(sd)
                else:
                    carried = fresh
            # Entries carried over were read when they were indexed: only new files are checked.
            for entry in os.scandir(live):
                if not is_package_file(entry.name):
                    continue
                if not entry.is_file(follow_symlinks=False):
                    # A link could serve a file its owner never published (a private package),
                    # and reading a FIFO or /dev/zero in its place would hang every publish.
                    done.ignored.append(f"{sd}/{entry.name}: it is a symbolic link or not a regular file")
                    continue
                if why := withheld.get(f"{sd}/{entry.name}"):
                    done.ignored.append(f"{sd}/{entry.name}: {why}")
                    continue
                if entry.name not in carried and (why := unindexable(Path(entry.path))):
                    done.ignored.append(f"{sd}/{entry.name}: {why}")
                    continue
                _shadow_entry(entry, shadow / sd / entry.name)
        index_fs(shadow)
        for sd in names:
            new = shadow / sd / "repodata.json"
            with new.open("rb") as fh:
                os.fsync(fh.fileno())
            safe_files.set_mode(new, 0o644)
            safe_files.rename(new, channel / sd / "repodata.json", beneath=channel)
            # A stale .zst or shard index from another tool would shadow the fresh json.
            for stale in ("repodata.json.zst", "repodata_shards.msgpack.zst", "shards"):
                safe_files.remove_quietly(channel / sd / stale, beneath=channel)
            fsync_dir(channel / sd)
    finally:
        safe_files.remove_quietly(shadow)
    # Linking into the shadow and unlinking it moved the ctime of this user's packages: dated
    # after that, the repodata marks them as indexed, so the next run trusts their entries and
    # a later change of a package (a newer ctime) is still seen.
    for sd in names:
        dated_after_its_packages(channel, sd)
    return done


def dated_after_its_packages(channel: Path, sd: str) -> None:
    """Touch the subdir's repodata.json until its mtime is strictly after every package's ctime.
    The kernel dates files by a coarse clock (a tick of some ms): a touch in the tick of the
    shadow's unlink gets the packages' own time, and an equal time reads as rewritten since
    (carry_fresh_entries), so every later index read the whole channel again (~30 s a torch row)."""
    live = channel / sd
    newest = max((e.stat(follow_symlinks=False).st_ctime_ns for e in os.scandir(live)
                  if is_package_file(e.name) and e.is_file(follow_symlinks=False)), default=0)
    for _ in range(200):
        safe_files.touch(live / "repodata.json", beneath=channel)
        if (live / "repodata.json").lstat().st_mtime_ns > newest:
            return
        time.sleep(0.005)


def index_channel(channel: Path) -> None:
    """Write repodata.json for every subdir, readable by everyone (a shared channel is served as is)."""
    safe_files.make_dirs(channel)
    for sub in REQUIRED_SUBDIRS:
        make_dir(channel / sub, like=channel)
    for ignored in reindex(channel).ignored:
        log.warning("not indexed (not served): %s/%s", channel, ignored)
    for sub in REQUIRED_SUBDIRS:
        for name in safe_files.names(channel / sub, beneath=channel):
            # Another member's files keep the mode they were published with, and a link planted
            # here is not followed to a private file elsewhere.
            safe_files.set_mode(channel / sub / name, 0o644, beneath=channel)
