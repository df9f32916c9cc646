"""Re-index a channel folder with rattler so readers only ever see complete repodata.

rattler's indexer writes repodata.json in place. Readers on other nodes (solvers, installers)
may read while we write, so we index a shadow copy of the channel (hard links to the
package files, plus the current repodata.json so indexing stays incremental) and rename
each finished repodata.json over the live one: a reader sees the old file or the new one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import ExtforgeError
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
    code = (
        "import asyncio, sys; from rattler.index import index_fs; "
        "asyncio.run(index_fs(sys.argv[1], write_zst=False, write_shards=False)); sys.stdout.flush(); "
        "import os; os._exit(0)"
    )
    # cwd: rattler reads os.getcwd() on import, and ours may have been deleted under a long build.
    folder = Path(folder).absolute()
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, cwd=folder)
    if proc.returncode != 0:
        raise ExtforgeError(
            f"could not index the channel folder {folder}",
            (proc.stderr.strip().splitlines() or [f"the indexer exited with {proc.returncode}"])[-1],
            "check that the folder is writable and holds only valid .conda/.tar.bz2 packages",
        )


def reindex(channel: Path) -> None:
    """Index every subdir of a channel folder and atomically replace its repodata.json files."""
    shadow = channel / f"{TEMP_PREFIX}index-{os.getpid()}"
    shutil.rmtree(shadow, ignore_errors=True)
    try:
        names = subdirs(channel)
        for sd in names:
            live = channel / sd
            live.mkdir(exist_ok=True)
            (shadow / sd).mkdir(parents=True)
            for entry in os.scandir(live):
                if is_package_file(entry.name):
                    os.link(entry.path, shadow / sd / entry.name)
            if (live / "repodata.json").exists():
                shutil.copyfile(live / "repodata.json", shadow / sd / "repodata.json")
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
