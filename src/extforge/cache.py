"""What extforge keeps under the cache root, and removing what has gone unused.

The cache grows without bound on a machine that keeps it: every change of a torch build, a
toolkit or extforge's own package recipes adds entries (a torch row is ~7 GB of wheels and
packages) and nothing retires the old ones. Each area holds entries, one folder (or file) per
content key. An entry's last use is its mtime, which the code that reuses an entry refreshes
(paths.mark_used), so an entry's age means "unused for that long", not "old".
rattler's own extracted packages are the exception: rattler does not refresh them, so a pruned
one that was still in use is extracted again at its next install (time, not correctness).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import safe_files
from .errors import ExtforgeError

DAY_S = 24 * 3600


@dataclass(frozen=True)
class Area:
    name: str
    rel: str  # folder under the cache root whose children are the entries (a glob: one folder per user)
    what: str
    # Listed only: entries that a prune by age would break (a user's HMAC secret) or that their
    # own tool sizes and evicts (the compiler cache).
    prunable: bool = True


AREAS = (
    Area("mirror-packages", "mirror/packages", "conda packages built by `extforge mirror`"),
    Area("mirror-wheels", "mirror/wheel-store", "downloaded wheels, one copy per sha256"),
    Area("wheel-requests", "mirror/wheels", "pip download folders (hard links into mirror-wheels)"),
    Area("toolkits", "toolkits", "CUDA toolkits fetched for the mirror"),
    Area("audit-targets", "audit-targets", "pinned torch environments the audit resolves against"),
    Area("package-store", "pkgs", "package archives checked by `extforge install`"),
    Area("rattler", "rattler/pkgs", "rattler's extracted packages (build and install environments)"),
    Area("sources", "sources/sha256", "recipe sources, by sha256"),
    Area("test-fixtures", "test-fixtures", "the test suite's channels and builds, one folder per checkout"),
    Area("mirror-work", "mirror/work", "rattler-build work folders of mirror packages being built (or interrupted)"),
    Area("unit-costs", "unit-costs", "compile costs learned from this machine's builds, per recipe and version (the planner's)"),
    Area("channels", "channels", "channels kept under the cache (scripts/demo's mirror)"),
    Area("audit-torch", "audit-torch", "unpacked torch wheels the test suite and the audit bench audit against"),
    Area("test-tools", "tools", "tools the test suite installs once (conda-lock's environment)"),
    Area("logs", "logs", "crash logs (the newest 20 are kept)"),
    Area("compile", "compile", "the compiler cache (ccache/sccache; sized and evicted by that tool)", prunable=False),
    Area("trust", "trust-*", "install and verify's trusted manifests and secret, one private folder per user",
         prunable=False),
)


@dataclass(frozen=True)
class Entry:
    area: str
    path: Path
    last_used: float  # epoch seconds
    bytes: int  # disk blocks of files not already counted for an earlier entry (hard links once)
    # The cache root: nothing below it is followed when the entry is removed (an area folder
    # that someone replaced by a link to elsewhere must not lead the prune there).
    root: Path


PRUNING = ".pruning-"


def _is_entry(path: Path) -> bool:
    # Locks and a concurrent run's temporary folders are not entries; what an interrupted prune
    # left behind is (see remove).
    name = path.name
    return name.startswith(PRUNING) or not (name.startswith(".") or name.endswith(".lock") or ".tmp" in name)


def _walk(path: Path) -> Iterator[os.stat_result]:
    """lstat of `path` and of everything under it (symlinks are not followed)."""
    stack = [path]
    while stack:
        p = stack.pop()
        try:
            st = p.lstat()
        except OSError:
            continue
        yield st
        if p.is_dir() and not p.is_symlink():
            try:
                stack.extend(p.iterdir())
            except OSError:
                pass


def _disk_bytes(path: Path, seen: set[tuple[int, int]]) -> int:
    total = 0
    for st in _walk(path):
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            total += st.st_blocks * 512
    return total


@dataclass(frozen=True)
class Freeable:
    total: int
    by_area: dict[str, int]  # what removing only that area's entries would give back


def freeable(entries: Iterable[Entry]) -> Freeable:
    """Disk bytes that removing `entries` gives back, in one walk: a file also linked from
    elsewhere (another area, an installed environment) stays on disk, so it does not count."""
    links: dict[tuple[int, int], tuple[list[int], set[str]]] = {}  # inode -> ([links seen, nlink, blocks], areas)
    for entry in entries:
        for st in _walk(entry.path):
            counts, areas = links.setdefault((st.st_dev, st.st_ino), ([0, st.st_nlink, st.st_blocks * 512], set()))
            counts[0] += 1
            areas.add(entry.area)
    total = 0
    by_area: dict[str, int] = {}
    for (here, nlink, blocks), areas in links.values():
        if here >= nlink:
            total += blocks
            if len(areas) == 1:
                (area,) = areas
                by_area[area] = by_area.get(area, 0) + blocks
    return Freeable(total, by_area)


def _children(root: Path, area: Area) -> list[Path]:
    folders = sorted(root.glob(area.rel)) if "*" in area.rel else [root / area.rel]
    found: list[Path] = []
    for folder in folders:
        try:
            found += [folder / name for name in sorted(safe_files.names(folder, beneath=root))]
        except (OSError, ExtforgeError):
            continue  # absent, another user's private folder, or a link in place of the area (not ours)
    return found


def scan(root: Path, areas: Iterable[Area] = AREAS) -> Iterator[Entry]:
    """Every entry of `areas` under `root`; a file hard-linked from two entries counts for the first."""
    seen: set[tuple[int, int]] = set()
    for area in areas:
        for path in _children(root, area):
            if not _is_entry(path):
                continue
            try:
                used = 0.0 if path.name.startswith(PRUNING) else path.lstat().st_mtime
            except OSError:
                continue
            yield Entry(area.name, path, used, _disk_bytes(path, seen), root)


def unused(entries: Iterable[Entry], now: float, days: float) -> list[Entry]:
    """The entries not used for at least `days` days at `now`."""
    cutoff = now - days * DAY_S
    return [e for e in entries if e.last_used <= cutoff]


def remove(entry: Entry) -> None:
    """Delete one entry so that a concurrent reader sees it whole or not at all.

    Renaming first makes it vanish in one step (a reader then rebuilds it, as on a cold cache)
    instead of showing a half-deleted package or environment."""
    doomed = entry.path
    if not entry.path.name.startswith(PRUNING):
        doomed = entry.path.with_name(f"{PRUNING}{entry.path.name}-{os.getpid()}")
        try:
            safe_files.rename(entry.path, doomed, beneath=entry.root)
        except FileNotFoundError:
            return  # removed by another prune
    safe_files.remove_quietly(doomed, beneath=entry.root)
