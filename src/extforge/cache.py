"""What extforge keeps under the cache root, and removing what has gone unused.

Every change of a torch build, a toolkit or extforge's own package recipes adds entries (a
torch row is ~7 GB of wheels and packages) and nothing retires the old ones by itself: `extforge
cache --prune DAYS` removes what went unused for that long, and work that fills the cache first
makes room (make_room) where its disk has less than $EXTFORGE_CACHE_MIN_FREE GiB free, removing
the least recently used entries. Each area holds entries, one folder (or file) per
content key. An entry's last use is its mtime, which the code that reuses an entry refreshes
(paths.mark_used), so an entry's age means "unused for that long", not "old".
rattler's own extracted packages are the exception: rattler does not refresh them, so a pruned
one that was still in use is extracted again at its next install (time, not correctness).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import safe_files
from .errors import ExtforgeError, file_system

DAY_S = 24 * 3600


@dataclass(frozen=True)
class Area:
    name: str
    rel: str  # folder under the cache root whose children are the entries (a glob: one folder per user)
    what: str
    # Listed only: entries that a prune by age would break (a user's HMAC secret, a channel
    # others install from) or that their own tool sizes and evicts (the compiler cache).
    prunable: bool = True


# A published channel is served to others, who cannot tell that it went: never pruned.
CHANNELS = Area("channels", "channels", "channels published under the cache (scripts/demo's mirror)", prunable=False)

AREAS = (
    Area("mirror-packages", "mirror*/packages", "conda packages built by `extforge mirror`"),
    Area("mirror-wheels", "mirror*/wheel-store", "downloaded wheels, one copy per sha256"),
    Area("wheel-requests", "mirror*/wheels", "pip download folders (hard links into mirror-wheels)"),
    Area("toolkits", "toolkits*", "CUDA toolkits fetched for the mirror"),
    Area("audit-targets", "audit-targets*", "pinned torch environments the audit resolves against"),
    # <name>-<uid>: a user's own in a cache root others may write (paths.own_area).
    Area("package-store", "pkgs*", "package archives checked by `extforge install`"),
    Area("rattler", "rattler*/pkgs", "rattler's extracted packages (build and install environments)"),
    Area("sources", "sources/sha256", "recipe sources, by sha256"),
    Area("test-fixtures", "test-fixtures", "the test suite's channels and builds, one folder per checkout"),
    Area("mirror-work", "mirror*/work", "rattler-build work folders of mirror packages being built (or interrupted)"),
    # A running build marks its own used as it reports progress (building/build.py's work_folder).
    Area("build-work", "builds*", "rattler-build work folders of `extforge build` (a failed build's, kept to look at)"),
    Area("unit-costs", "unit-costs", "compile costs learned from this machine's builds, per recipe and version (the planner's)"),
    CHANNELS,
    Area("audit-torch", "audit-torch", "unpacked torch wheels the test suite and the audit bench audit against"),
    Area("test-tools", "tools", "tools the test suite installs once (conda-lock's environment)"),
    Area("logs", "logs*", "crash logs (each user's newest 20 are kept)"),
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
    owner: int  # uid

    @property
    def mine(self) -> bool:
        """Whether this user may remove it: in a cache shared by several users, another user's
        entry is theirs to prune (root's cleanup aside)."""
        return self.owner == os.geteuid() or os.geteuid() == 0


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


@dataclass
class _Inode:
    nlink: int
    blocks: int
    holders: list[int]  # indexes of the entries that hold a name of it, once per name


def _inodes(entries: Sequence[Entry]) -> list[list[_Inode]]:
    """Per entry, the inodes of its files (one walk): who else holds a name of each decides
    whether removing the entry gives its blocks back."""
    table: dict[tuple[int, int], _Inode] = {}
    per_entry: list[list[_Inode]] = []
    for i, entry in enumerate(entries):
        mine = []
        for st in _walk(entry.path):
            inode = table.setdefault((st.st_dev, st.st_ino), _Inode(st.st_nlink, st.st_blocks * 512, []))
            inode.holders.append(i)
            mine.append(inode)
        per_entry.append(mine)
    return per_entry


def freeable(entries: Iterable[Entry]) -> Freeable:
    """Disk bytes that removing `entries` gives back, in one walk: a file also linked from
    elsewhere (another area, an installed environment) stays on disk, so it does not count."""
    entries = list(entries)
    total = 0
    by_area: dict[str, int] = {}
    for inode in {id(n): n for names in _inodes(entries) for n in names}.values():
        if len(inode.holders) >= inode.nlink:
            total += inode.blocks
            areas = {entries[i].area for i in inode.holders}
            if len(areas) == 1:
                (area,) = areas
                by_area[area] = by_area.get(area, 0) + inode.blocks
    return Freeable(total, by_area)


def eviction_plan(candidates: Sequence[Entry], shortfall: int) -> tuple[list[Entry], int]:
    """The entries to remove, least recently used first, to give back `shortfall` bytes, and
    what they give back: from the shortest run of `candidates` (in their order) that frees that
    much, the entries whose removal gives back most of their bytes. A file also linked from
    elsewhere stays on disk, so an entry whose large files are linked from elsewhere stays too
    (a mirror package linked into a channel would go for its 1 KiB package.json, freeing nothing
    of the package and making the cache colder); a package linked from a channel and the package
    store goes only together with both. All that can be freed if the candidates cannot free
    `shortfall`."""
    per_entry = _inodes(candidates)
    own = [list({id(n): n for n in names}.values()) for names in per_entry]  # each inode once
    sizes = [sum(n.blocks for n in inodes) for inodes in own]
    gives = [0] * len(candidates)  # what removing the entry gives back, given the run so far
    seen: dict[int, int] = {}
    plan: set[int] = set()
    freed = 0
    for i, names in enumerate(per_entry):
        if freed >= shortfall:
            break
        grown = {i}
        for inode in names:
            seen[id(inode)] = seen.get(id(inode), 0) + 1
            if seen[id(inode)] == inode.nlink:  # every name of it is in the run: it can go
                for holder in set(inode.holders):
                    gives[holder] += inode.blocks
                grown.update(inode.holders)
        for entry in sorted(grown - plan):
            if 2 * gives[entry] < sizes[entry]:
                continue
            plan.add(entry)
            # An inode's blocks come back when the last of its holders joins the plan.
            for inode in own[entry]:
                if seen.get(id(inode), 0) == inode.nlink and all(h in plan for h in inode.holders):
                    freed += inode.blocks
    return [candidates[i] for i in sorted(plan)], freed


def _children(root: Path, area: Area) -> list[Path]:
    folders = sorted(root.glob(area.rel)) if "*" in area.rel else [root / area.rel]
    found: list[Path] = []
    for folder in folders:
        try:
            found += [folder / name for name in sorted(safe_files.names(folder, beneath=root))]
        except (OSError, ExtforgeError):
            continue  # absent, another user's private folder, or a link in place of the area (not ours)
    return found


def scan(root: Path, areas: Iterable[Area] = AREAS, sizes: bool = True) -> Iterator[Entry]:
    """Every entry of `areas` under `root`; a file hard-linked from two entries counts for the
    first. Without `sizes`, no entry's files are walked (bytes 0)."""
    seen: set[tuple[int, int]] = set()
    for area in areas:
        for path in _children(root, area):
            if not _is_entry(path):
                continue
            try:
                st = path.lstat()
            except OSError:
                continue
            used = 0.0 if path.name.startswith(PRUNING) else st.st_mtime
            yield Entry(area.name, path, used, _disk_bytes(path, seen) if sizes else 0, root, st.st_uid)


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


def human_size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


MIN_FREE_ENV = "EXTFORGE_CACHE_MIN_FREE"
DEFAULT_MIN_FREE_GIB = 20.0
# Removed beyond the minimum, so that the next few writes do not each walk the cache again.
HEADROOM = 5 * 2**30
# An entry used this recently may belong to a run in progress (an install about to link from
# it, a test session's fixtures); the prune by age has no such guard, its user chose the age.
IN_USE_S = 30 * 60


def min_free() -> int:
    """Bytes the cache keeps free on its disk ($EXTFORGE_CACHE_MIN_FREE, in GiB; 0: off)."""
    text = os.environ.get(MIN_FREE_ENV, "").strip()
    if not text:
        return int(DEFAULT_MIN_FREE_GIB * 2**30)
    try:
        gib = float(text)
    except ValueError:
        gib = -1.0
    if not gib >= 0:  # also refuses nan
        raise ExtforgeError(f"${MIN_FREE_ENV}={text!r} is not a number of GiB",
                            "it is how much free disk the cache keeps beside itself, in GiB",
                            f"set it like {MIN_FREE_ENV}=20 (0 turns the removal off) or unset it "
                            f"(default {DEFAULT_MIN_FREE_GIB:g})")
    return int(gib * 2**30)


@dataclass(frozen=True)
class Room:
    """What make_room did: the disk was short of `target` free bytes."""

    free_before: int
    target: int
    floor: int  # min_free()
    removed: list[Entry]
    freed: int  # measured on the disk
    published: list[Path]  # channels under the cache, kept whatever the shortfall

    def describe(self, root: Path, purpose: str) -> str:
        gib = human_size
        areas: dict[str, int] = {}
        for entry in self.removed:
            areas[entry.area] = areas.get(entry.area, 0) + 1
        text = (f"the disk of extforge's cache ({root}) had {gib(self.free_before)} free, less than the "
                f"{gib(self.target)} to keep free before {purpose} (${MIN_FREE_ENV}: at least {gib(self.floor)}): ")
        if self.removed:
            text += (f"removed {len(self.removed)} cache entries unused for {IN_USE_S // 60} minutes or more, least "
                     f"recently used first ({', '.join(f'{a} {n}' for a, n in areas.items())}), {gib(self.freed)} freed")
        else:
            text += f"no cache entry unused for {IN_USE_S // 60} minutes frees space (each is linked from elsewhere)"
        if self.free_before + self.freed < self.target:
            text += "; still short: free space on that disk or point EXTFORGE_CACHE at a bigger one"
            if self.published:
                text += (f" (kept: the published channel(s) {', '.join(p.name for p in self.published)} in "
                         f"{self.published[0].parent}, never removed: others install from them; remove one by hand "
                         "once nobody does)")
        return text


def make_room(root: Path, purpose: str, need: int = 0) -> Room | None:
    """Before `purpose`, work that fills the cache: where its disk has less free than
    min_free() (or `need`, if more), remove the least recently used entries not in use until it
    has that much and HEADROOM more, like Nix's min-free, and say so (a warning). None where
    nothing was short. A cache that nobody prunes by hand then fills its disk only with what is
    in use: every change of extforge's package recipes leaves a generation of packages behind."""
    floor = min_free()
    target = max(floor, need) if floor else 0
    free = file_system(str(root))[1]
    if free >= target:
        return None
    cutoff = time.time() - IN_USE_S
    candidates = sorted((e for e in scan(root, [a for a in AREAS if a.prunable], sizes=False)
                         if e.last_used <= cutoff and e.mine), key=lambda e: e.last_used)
    doomed, _ = eviction_plan(candidates, target + HEADROOM - free)
    removed = []
    for entry in doomed:
        try:
            remove(entry)
        except (OSError, ExtforgeError):
            continue  # what it holds is not all ours to delete (another user's files in it): it stays
        removed.append(entry)
    published = [e.path for e in scan(root, [CHANNELS], sizes=False)]
    room = Room(free, target, floor, removed, file_system(str(root))[1] - free, published)
    logging.getLogger("extforge").warning(room.describe(root, purpose))
    return room
