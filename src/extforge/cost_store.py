"""Build costs learned from a site's own builds, so the planner improves with use.

Profiles shipped in `data/` cover the recipes extforge measured (flash-attn, FlashAttention-3);
any other recipe is planned from conservative defaults until it has been built once. After a
successful build, `learn_from_build` turns the build's ninja log into that recipe's per-unit
seconds and stores them with the largest compiler process seen, keyed by recipe and version:
`<store>/<recipe>/<version>.json`. The store is the site's, not the installed package's:
`$EXTFORGE_COST_STORE` (e.g. a folder beside the channel on shared storage, so every build
node learns from every other), else `<cache root>/unit-costs`.

What is measured, exactly:
- each unit's seconds: ninja's start and end of each compile, at the number of compiles the
  build ran at once (the log's own maximum) and the build's NVCC_THREADS;
- `runs`: which units each ninja run compiled, where setuptools ran one per extension: they
  cannot run beside each other, and the planner schedules them run by run;
- `largest_process_bytes`: `getrusage(RUSAGE_CHILDREN).ru_maxrss` of the extforge process,
  the largest resident set of any one finished descendant (cicc, ptxas, cc1plus...) since the
  process started. It is one process, not the sum of the jobs running at once, nor a job's
  nvcc driver beside its child: the planner adds LEARNED_PEAK_MARGIN. Compiles run by a daemon
  (sccache's server) are not our descendants, so a build through sccache records no peak.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import functools
import json
import os
import re
import resource
import socket
import types
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from . import paths, safe_files, shared_read, unit_costs
from .errors import ExtforgeError
from .ui import log

STORE_ENV = "EXTFORGE_COST_STORE"
# A recipe folder's own costs: a store entry (`<store>/<recipe>/<version>.json`) copied beside recipe.yaml.
RECIPE_FILE = "build-costs.json"
_RECIPE_DIRS: contextvars.ContextVar[Mapping[str, Path]] = contextvars.ContextVar("recipe_dirs",
                                                                                  default=types.MappingProxyType({}))
SCHEMA = 1
# A job's peak is its largest process plus nvcc's driver and the host compiler's front end
# beside it; a quarter more keeps a learned plan on the safe side of the measurement.
LEARNED_PEAK_MARGIN = 1.25
# A rebuild whose compiles came from the compile cache takes a small fraction of a real one
# (a hit is a copy: ~1 s against minutes); below this share of the stored seconds per arch it
# measures the cache, not the compiler. Nodes differ less (0.6-1.2x on flash-attn's units), so a
# real build on a faster node still replaces a slower node's entry.
CACHE_HIT_SHARE = 0.2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def root() -> Path:
    env = os.environ.get(STORE_ENV)
    return Path(env).expanduser() if env else paths.cache_root() / "unit-costs"


def entry_path(recipe: str, version: str, store: Path | None = None) -> Path:
    for what, value in (("recipe", recipe), ("version", version)):
        if not _NAME.fullmatch(value):
            raise ExtforgeError(f"cannot store build costs under the {what} '{value}'",
                                "a store entry is a file named by recipe and version: letters, digits and ._+- only",
                                "name the recipe folder (or --profile) and its version without other characters")
    return (store or root()) / recipe / f"{version}.json"


@dataclass(frozen=True)
class Learned:
    """One recipe version's costs, as its last measured build showed them."""

    recipe: str
    version: str
    measured_at: str  # ISO 8601, UTC, to the microsecond: the newest of a recipe's entries is the latest
    host: str
    archs: tuple[str, ...]
    jobs: int  # compiles the build ran at once (the log's maximum)
    nvcc_threads: int
    units: dict[str, float]  # seconds, in the order the build started them
    compile_seconds: float  # first start to last end of each ninja run in the log, added up
    largest_process_bytes: int | None = None
    path: Path = field(default=Path(), compare=False)
    runs: tuple[tuple[str, ...], ...] = ()  # units per ninja run, where the build ran several (unit_costs)
    # The units the build layer could compile as parallel parts: the parts each can have (its
    # explicit instantiations, where more than one and not found to need compiling whole).
    part_limits: dict[str, int] = field(default_factory=dict)

    @property
    def date(self) -> str:
        return self.measured_at[:10]

    def describe(self) -> str:
        return f"learned on {self.date} from {len(self.units)} units ({self.path})"

    def costs(self) -> unit_costs.UnitCosts:
        """The units as the planner's data: seconds of one nvcc thread for these archs. A unit
        compiled with several threads over several archs is taken as if they had parallelised
        perfectly (the planner then never expects fewer threads to be faster than they were)."""
        busy = min(self.nvcc_threads, max(1, len(self.archs)))
        # The seconds are as they ran, `jobs` at once; how they change with more or fewer beside
        # them was not measured (no slowdown assumed), so a machine's speed can still be read
        # against them while it builds.
        return unit_costs.UnitCosts(self.recipe, {u: s * busy for u, s in self.units.items()}, self.archs,
                                    self.describe(), concurrency=unit_costs.Concurrency(self.jobs, 0.0), runs=self.runs,
                                    part_limits=self.part_limits)

    def seconds_per_arch(self) -> float:
        """The build's compile seconds of one nvcc thread, per arch: what a cache-hit rebuild lacks."""
        return sum(self.units.values()) * min(self.nvcc_threads, max(1, len(self.archs))) / max(1, len(self.archs))

    def to_json(self) -> dict[str, object]:
        return {"schema": SCHEMA, "recipe": self.recipe, "version": self.version, "measured_at": self.measured_at,
                "host": self.host, "archs": list(self.archs), "jobs": self.jobs, "nvcc_threads": self.nvcc_threads,
                "compile_seconds": self.compile_seconds, "largest_process_bytes": self.largest_process_bytes,
                "units": self.units} | ({"runs": [list(r) for r in self.runs]} if self.runs else {}) \
            | ({"part_limits": self.part_limits} if self.part_limits else {})


# A store entry is another user's file (a site's store is shared by its build nodes): bounds
# far beyond any real build, so that what is read is a plan's input, never its undoing.
ENTRY_LIMIT = 4 * 2**20
LOG_LIMIT = 64 * 2**20  # a ninja log of a thousand-unit build, appended to by many rebuilds, is a few MB
MAX_UNITS = 20_000
MAX_UNIT_PARTS = 1024  # a unit's explicit instantiations compiled apart
MAX_SECONDS = 30 * 86400.0
# ru_maxrss of any process is above a MiB; a planted 0 would plan every compile at once.
PEAK_BYTES = (2**20, 2**44)
_ARCH = re.compile(r"[0-9]{1,4}[a-z]?")
_WHEN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[0-9T:.+-]{0,32}")
_HOST = re.compile(r"[!-~]{0,255}")


def _mapping(value: object, where: str, most: int) -> dict[object, object]:
    if not isinstance(value, dict) or len(value) > most:
        raise ValueError(f"{where} is not an object of at most {most} entries")
    return value


def _sequence(value: object, where: str, most: int) -> list[object]:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError(f"{where} is not a list of at most {most} items")
    return value


def from_json(d: object, path: Path) -> Learned:
    """An entry's values, each of its type and within its bounds (shared_read): ValueError
    names the first that is not."""
    d = _mapping(d, "the entry", 64)
    if d.get("schema") != SCHEMA:
        raise ValueError(f"not a schema {SCHEMA} cost entry")
    units = {shared_read.unit_name(u): shared_read.number(s, f"the seconds of {shared_read.shown(u)}", 0.0, MAX_SECONDS)
             for u, s in _mapping(d["units"], "units", MAX_UNITS).items()}
    if not units:
        raise ValueError("it names no unit")
    peak = d.get("largest_process_bytes")
    runs = tuple(tuple(shared_read.unit_name(u) for u in _sequence(r, "a run", MAX_UNITS))
                 for r in _sequence(d.get("runs", []), "runs", MAX_UNITS))
    if not all(runs):
        raise ValueError("a run names no unit")
    return Learned(
        shared_read.text(d["recipe"], "recipe", _NAME), shared_read.text(d["version"], "version", _NAME),
        shared_read.text(d["measured_at"], "measured_at", _WHEN), shared_read.text(d["host"], "host", _HOST),
        tuple(shared_read.text(a, "an arch", _ARCH) for a in _sequence(d["archs"], "archs", 64)),
        shared_read.integer(d["jobs"], "jobs", 1, 100_000), shared_read.integer(d["nvcc_threads"], "nvcc_threads", 1, 1024),
        units, shared_read.number(d["compile_seconds"], "compile_seconds", 0.0, MAX_SECONDS),
        None if peak is None else shared_read.integer(peak, "largest_process_bytes", *PEAK_BYTES), path, runs,
        {shared_read.unit_name(u): shared_read.integer(n, f"the parts of {shared_read.shown(u)}", 1, MAX_UNIT_PARTS)
         for u, n in _mapping(d.get("part_limits", {}), "part_limits", MAX_UNITS).items()})


def _read(path: Path) -> Learned | None:
    """The entry at `path`, None where there is none; one that cannot be used is one warning
    naming it and costs a re-measurement, never a plan or a build: the next build rewrites it."""
    try:
        return shared_read.read_json(path, lambda d: from_json(d, path), limit=ENTRY_LIMIT)
    except FileNotFoundError:
        return None
    except shared_read.Refused as exc:
        _warn_once(path, exc.reason)
        return None


@functools.cache
def _warn_once(path: Path, reason: str) -> None:
    """One warning a run: a build reads the store for its plan, its parts and its progress."""
    log.warning("ignoring the build-cost entry %s: %s (planned without it; remove it, and the next build of the "
                "recipe measures its costs again)", path, reason)


@contextlib.contextmanager
def recipe_costs(recipe_dir: Path) -> Iterator[None]:
    """While the body runs, `load` falls back, for that recipe, to the costs its folder ships
    (RECIPE_FILE: a store entry its author's build measured), so that a site's first build of it
    is planned from real numbers; the site's own entry, once it has one, wins."""
    token = _RECIPE_DIRS.set({**_RECIPE_DIRS.get(), recipe_dir.name: recipe_dir})
    try:
        yield
    finally:
        _RECIPE_DIRS.reset(token)


def load(recipe: str, version: str | None = None, store: Path | None = None) -> Learned | None:
    """The entry for `recipe` at `version`; without a version (or none stored for it), the most
    recently measured version of the recipe (its units are the likeliest to match); without any,
    what the recipe folder ships (recipe_costs)."""
    folder = (store or root()) / recipe
    # Only names the store writes: a planted name (a terminal escape) is not even named.
    site = [e for p in sorted(folder.glob("*.json")) if _NAME.fullmatch(p.stem) and (e := _read(p))] \
        if _NAME.fullmatch(recipe) and folder.is_dir() else []
    shipped_dir = _RECIPE_DIRS.get().get(recipe)
    shipped = _read(shipped_dir / RECIPE_FILE) if shipped_dir else None
    exact = [e for e in [*site, *filter(None, [shipped])] if version and e.version == version]
    return max(exact or site, key=lambda e: e.measured_at, default=shipped)


@dataclass(frozen=True)
class SplitLog:
    """What the build layer's split log says (split_unit.py: a JSON line per .cu unit with its
    explicit instantiations, and one per unit it was asked to compile in parts)."""

    parts: dict[str, int]  # the units compiled in parts, and into how many
    # Each of those units' seconds from its parts' (ninja's log times only the longest part): the
    # unit whose parts, as the planner models them (unit_costs.with_parts), took those seconds.
    seconds: dict[str, float]
    # The parts each unit can have: its instantiations; 1 where it had to be compiled whole; the
    # fewest where two files share a name.
    limits: dict[str, int]


def read_split_log(split_log: str) -> SplitLog:
    """The split log's text read; a line that is not a record of valid values is skipped."""
    out = SplitLog({}, {}, {})
    for line in split_log.splitlines():
        with contextlib.suppress(ValueError, KeyError):
            d = _mapping(shared_read.parse_json(line, "a line"), "a line", 16)
            unit = shared_read.unit_name(d["unit"])
            parts = shared_read.integer(d.get("parts", 0), "parts", 0, MAX_UNIT_PARTS)
            if parts > 1:
                seconds = sum(shared_read.number(s, "seconds", 0.0, MAX_SECONDS)
                              for s in _sequence(d["seconds"], "seconds", MAX_UNIT_PARTS))
                out.parts[unit] = parts
                out.seconds[unit] = round(seconds / (1 + parts * unit_costs.PART_REPEAT), 1)
            n = 1 if "compiled_whole" in d else shared_read.integer(d["instantiations"], "instantiations", 0, 100_000)
            out.limits[unit] = min(out.limits.get(unit, n), n)
    return out


def read_log(path: Path | None) -> str:
    """A build's ninja or split log in its work folder ('' for none), as every file of an output
    folder others may write is read (shared_read: a regular file, at most LOG_LIMIT bytes)."""
    if path is None:
        return ""
    try:
        return shared_read.read_text(path, limit=LOG_LIMIT)
    except FileNotFoundError:
        return ""


def measure(recipe: str, version: str, ninja_log: str, archs: Sequence[str], nvcc_threads: int,
            largest_process_bytes: int | None, split_log: str = "") -> Learned:
    edges = unit_costs.parse_ninja_log(ninja_log)
    if not edges:
        raise ValueError("the ninja log has no finished compile")
    units = unit_costs.unit_seconds(edges)
    split = read_split_log(split_log)
    return Learned(
        recipe, version, datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds"), socket.gethostname(),
        tuple(archs), max(n for _, n in unit_costs.running_counts(edges)), max(1, nvcc_threads),
        units | {u: s for u, s in split.seconds.items() if u in units}, unit_costs.compile_seconds(edges),
        largest_process_bytes, runs=unit_costs.ninja_runs(edges),
        part_limits={u: n for u, n in split.limits.items() if u in units and n > 1})


def save(entry: Learned, store: Path | None = None, cached: Collection[str] = ()) -> Learned | None:
    """Write `entry` atomically (readers on other nodes see the old entry or the new one),
    unless it measured compile-cache hits against a stored real build; the larger of the two
    largest processes is kept. `cached`: the units the compile cache said it served (a copy of
    ~1 s, not a compile): they keep their stored seconds, and one never compiled is not learned.
    None where nothing was compiled and nothing is stored."""
    path = entry_path(entry.recipe, entry.version, store)
    old = _read(path)
    if cached:
        stored = old.units if old else {}
        if all(u in cached for u in entry.units):
            log.info("%s %s: build costs not stored (every unit came from the compile cache)", entry.recipe, entry.version)
            return old
        entry = dataclasses.replace(entry, units={u: stored[u] if u in cached else s for u, s in entry.units.items()
                                                  if u not in cached or u in stored})
    if old and entry.seconds_per_arch() < CACHE_HIT_SHARE * old.seconds_per_arch():
        log.info("%s %s: build costs not stored (%.0f s of compiles per arch against %.0f s stored: compile-cache hits)",
                 entry.recipe, entry.version, entry.seconds_per_arch(), old.seconds_per_arch())
        return old
    peaks = [p for p in (entry.largest_process_bytes, old.largest_process_bytes if old else None) if p]
    # Checked as every reader checks it: an entry no reader would take is never written.
    kept = from_json(dataclasses.replace(entry, largest_process_bytes=max(peaks, default=None)).to_json(), path)
    safe_files.make_dirs(path.parent.parent)
    # Group bits of the store's folder: a store shared by a site's build nodes stays writable to them.
    safe_files.make_dir(path.parent)
    safe_files.write_atomic(path, (json.dumps(kept.to_json(), indent=1) + "\n").encode())
    return kept


def largest_child_process_bytes(build_env: Mapping[str, str]) -> int | None:
    """ru_maxrss of this process's finished descendants (Linux: KiB); None when the compiles
    ran outside them (sccache's server)."""
    if "SCCACHE_DIR" in build_env:
        return None
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 or None


def learn_from_build(recipe: str, version: str, ninja_log: Path | None, archs: Sequence[str],
                     build_env: Mapping[str, str], split_log: Path | None = None,
                     cached: Collection[str] = ()) -> Learned | None:
    """After a successful build: its ninja log becomes `recipe`'s costs at `version`, but for the
    units the compile cache served (`cached`: save). A build without a log (no ninja: a
    pure-Python or CMake package) or a store that cannot be written is said in the log, never a
    failed build: the package is already made."""
    if ninja_log is None:
        return None
    try:
        entry = measure(recipe, version, read_log(ninja_log), archs, int(build_env.get("NVCC_THREADS", "1")),
                        largest_child_process_bytes(build_env), read_log(split_log))
        return save(entry, cached=cached)
    except (ExtforgeError, OSError, ValueError) as exc:
        log.warning("build costs of %s %s not stored: %s", recipe, version, exc)
        return None


def recipe_version(recipe_text: str) -> str | None:
    """The version a recipe's costs are stored under: its context's or package's literal
    version (None where it is a template the recipe's variables decide)."""
    with contextlib.suppress(YAMLError):
        d = YAML(typ="safe").load(recipe_text)
        if isinstance(d, dict):
            for section in ("context", "package"):
                value = (d.get(section) or {}).get("version")
                if value is not None and "${{" not in str(value):
                    return str(value)
    return None
