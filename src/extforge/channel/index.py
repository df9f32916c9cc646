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

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from ..archive import package_tars
from ..errors import ExtforgeError
from ..safe_files import make_dir
from ..ui import log
from .hashing import fsync_dir

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
    candidates = list(channel.glob(f"{TEMP_PREFIX}index-*")) + list(channel.glob(f"*/{TEMP_PREFIX}tmp-*"))
    for path in candidates:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
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
        written = repodata.stat().st_mtime_ns
        data = json.loads(repodata.read_bytes())
        for key in ("packages", "packages.conda"):
            entries = data.get(key) or {}
            for name in list(entries):
                if not is_package_file(name) or "/" in name:
                    raise ValueError(f"entry {name!r} is no package file of this folder")
                try:
                    st = (live / name).stat()
                except OSError:
                    continue  # gone: the indexer drops it
                if st.st_mtime_ns >= written or st.st_size != entries[name].get("size"):
                    del entries[name]
                else:
                    carried.add(name)
    except (OSError, ValueError, AttributeError, TypeError):
        # Empty, truncated, a JSON list, entries that are no objects: nothing in it is trusted.
        return None
    dest.write_text(json.dumps(data))
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


def _clone_or_copy(src: str, dest: Path) -> None:
    """copy_file_range: the kernel clones where the filesystem can (btrfs, XFS) and NFS 4.2
    copies on the server; a plain copy where neither works. The shadow must not alias a file
    another user owns."""
    with open(src, "rb") as fin, open(dest, "xb") as fout:
        try:
            while os.copy_file_range(fin.fileno(), fout.fileno(), 1 << 30):
                pass
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
            shutil.copyfileobj(fin, fout, 4 * 1024 * 1024)


def _shadow_entry(entry: os.DirEntry, dest: Path) -> None:
    if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.geteuid():
        os.link(entry.path, dest)
    else:
        _clone_or_copy(entry.path, dest)  # another user's file, or a symlink to a package: its bytes


@dataclass
class Reindexed:
    rebuilt: list[str] = field(default_factory=list)  # subdirs whose damaged repodata.json was rebuilt
    ignored: list[str] = field(default_factory=list)  # "subdir/file: why": package files not served


def reindex(channel: Path) -> Reindexed:
    """Index every subdir of a channel folder and atomically replace its repodata.json files.

    A subdir's repodata.json that is damaged (empty, truncated, not an object) is rebuilt from
    the package files; a package file the indexer could not read is left out (not served)."""
    shadow = channel / f"{TEMP_PREFIX}index-{os.getpid()}"
    shutil.rmtree(shadow, ignore_errors=True)
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
                if not (is_package_file(entry.name) and entry.is_file()):
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
            os.chmod(new, 0o644)
            os.replace(new, channel / sd / "repodata.json")
            # A stale .zst or shard index from another tool would shadow the fresh json.
            (channel / sd / "repodata.json.zst").unlink(missing_ok=True)
            (channel / sd / "repodata_shards.msgpack.zst").unlink(missing_ok=True)
            shutil.rmtree(channel / sd / "shards", ignore_errors=True)
            fsync_dir(channel / sd)
    finally:
        shutil.rmtree(shadow, ignore_errors=True)
    return done


def index_channel(channel: Path) -> None:
    """Write repodata.json for every subdir, readable by everyone (a shared channel is served as is)."""
    channel.mkdir(parents=True, exist_ok=True)
    for sub in REQUIRED_SUBDIRS:
        make_dir(channel / sub, like=channel)
    for ignored in reindex(channel).ignored:
        log.warning("not indexed (not served): %s/%s", channel, ignored)
    for sub in REQUIRED_SUBDIRS:
        for f in (channel / sub).iterdir():
            # Another member's files keep the mode they were published with (we may not chmod them).
            if f.is_file() and f.stat().st_uid == os.geteuid():
                f.chmod(0o644)
