"""Build costs learned from a site's own builds, so the planner improves with use.

After a successful build, `learn_from_build` turns the build's ninja log into the recipe's
per-unit seconds and stores them with the largest compiler process seen, keyed by the package's
name and version: `<store>/<name>/<version>.json`. The store is the site's, not the installed
package's: `$EXTFORGE_COST_STORE` (e.g. a folder beside the channel on shared storage, so every
build node learns from every other), else `<cache root>/unit-costs`. A recipe folder may ship an
entry of its own (RECIPE_FILE, the same format), which plans a site's first build of it; that
entry may also say what the recipe's author knows of its units beyond their seconds (`planner`,
RecipeModel: which units a subset variant builds, which can be split, a measured job peak).

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

from .. import paths, safe_files, shared_read
from ..errors import ExtforgeError
from ..ui import log
from . import unit_costs

STORE_ENV = "EXTFORGE_COST_STORE"
# A recipe folder's own costs: a store entry (`<store>/<name>/<version>.json`) copied beside recipe.yaml.
RECIPE_FILE = "build-costs.json"
_RECIPE_DIRS: contextvars.ContextVar[Mapping[str, Path]] = contextvars.ContextVar("recipe_dirs",
                                                                                  default=types.MappingProxyType({}))
SCHEMA = 1
# A job's peak is its largest process plus nvcc's driver and the host compiler's front end
# beside it; a quarter more keeps a learned plan on the safe side of the measurement.
LEARNED_PEAK_MARGIN = 1.25
# A rebuild whose compiles came from the compile cache takes a small fraction of a real one
# (a hit is a copy: ~1 s against minutes); below this share of the stored seconds per arch it
# measures the cache, not the compiler. Nodes differ less (0.6-1.2x on one recipe's units), so a
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
                                "a store entry is a file named by package name and version: letters, digits and ._+- only",
                                "name the package (or --profile) and its version without other characters")
    return (store or root()) / recipe / f"{version}.json"


@dataclass(frozen=True)
class RecipeModel:
    """What a recipe folder's own entry says of its units beyond their seconds (its `planner`
    section): a measured job peak where one process is not the whole job (nvcc's threads), the
    final link, units that compile for one arch each, how the compiles slow each other down, the
    nodes measured against the seconds, which units a subset variant builds, which units a
    recipe-side step can shard in two. Its author measured it; a site's learned entry of the
    same recipe is planned with it too."""

    per_job_peak_gib: float | None = None
    per_extra_thread_gib: float | None = None
    seconds_per_unit_arch: float | None = None
    link_seconds: float = 0.0
    # Each unit compiles for one arch of its own (FA3's `_sm80.cu` and `_sm90.cu` files): more archs
    # add no work per unit, and nvcc --threads has nothing to run in parallel.
    one_arch_per_unit: bool = False
    # How much longer a unit takes per other compile beside it (unit_costs.Concurrency; the
    # entry's seconds are at its `jobs` compiles at once), and where that was measured.
    per_compile: float = 0.0
    per_compile_measured: str = ""
    # Nodes measured against the shipped entry's seconds (their compile speed).
    node_speeds: dict[str, float] = field(default_factory=dict)
    subsets: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    shards: unit_costs.ShardModel | None = None
    measured: str = ""


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
    units: dict[str, float | None]  # seconds, in the order the build started them (None: not measured)
    compile_seconds: float  # first start to last end of each ninja run in the log, added up
    largest_process_bytes: int | None = None
    path: Path = field(default=Path(), compare=False)
    runs: tuple[tuple[str, ...], ...] = ()  # units per ninja run, where the build ran several (unit_costs)
    # The units the build layer could compile as parallel parts: the parts each can have (its
    # explicit instantiations, where more than one and not found to need compiling whole).
    part_limits: dict[str, int] = field(default_factory=dict)
    # What the recipe folder's own entry says of its units (never in a site's learned entry).
    model: RecipeModel | None = field(default=None, compare=False)

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
        model = self.model or RecipeModel()
        # The seconds are as they ran, `jobs` at once; unless the recipe's data says how they
        # change with more or fewer beside them, no slowdown is assumed, so that a machine's speed
        # can still be read against them while it builds.
        return unit_costs.UnitCosts(self.recipe, {u: None if s is None else s * busy for u, s in self.units.items()},
                                    self.archs, self.describe(), model.shards,
                                    unit_costs.Concurrency(self.jobs, model.per_compile, model.per_compile_measured),
                                    model.node_speeds, model.subsets, self.runs, self.part_limits)

    def seconds_per_arch(self) -> float:
        """The build's compile seconds of one nvcc thread, per arch: what a cache-hit rebuild lacks."""
        measured = sum(s for s in self.units.values() if s is not None)
        return measured * min(self.nvcc_threads, max(1, len(self.archs))) / max(1, len(self.archs))

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


# A recipe folder's own words: provenance notes, variant keys and values, parts of unit names.
_NOTE = re.compile(r"[ -~]{0,4000}")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_VALUE = re.compile(r"[A-Za-z0-9._+-]{1,32}")
_PART = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def _optional(d: dict[object, object], key: str, low: float, high: float) -> float | None:
    return None if d.get(key) is None else shared_read.number(d[key], f"planner.{key}", low, high)


def model_from_json(value: object) -> RecipeModel:
    """A recipe folder's `planner` section, each value of its type and within its bounds."""
    d = _mapping(value, "planner", 32)
    shards = _mapping(d.get("shards") or {}, "planner.shards", 4)
    kinds = {}
    for name, kind in _mapping(shards.get("kinds") or {}, "planner.shards.kinds", 64).items():
        k = _mapping(kind, f"the shard kind {shared_read.shown(name)}", 8)
        kinds[shared_read.text(name, "a shard kind", _KEY)] = unit_costs.ShardKind(
            shared_read.text(k["prefix"], "a shard kind's prefix", _PART),
            shared_read.number(k["repeated"], "a shard kind's repeated share", 0.0, 1.0),
            shared_read.number(k["twin_share"], "a shard kind's twin share", 0.0, 1.0))
    subsets = {shared_read.text(key, "a subset key", _KEY): {
        shared_read.text(v, "a subset value", _VALUE): tuple(
            shared_read.text(part, "a part of a unit name", _PART)
            for part in _sequence(parts if isinstance(parts, list) else [parts], "the parts of a subset value", 64))
        for v, parts in _mapping(values, f"the values of {shared_read.shown(key)}", 256).items()}
        for key, values in _mapping(d.get("subsets") or {}, "planner.subsets", 64).items()}
    return RecipeModel(
        per_job_peak_gib=_optional(d, "per_job_peak_gib", 0.01, 4096.0),
        per_extra_thread_gib=_optional(d, "per_extra_thread_gib", 0.0, 4096.0),
        seconds_per_unit_arch=_optional(d, "seconds_per_unit_arch", 0.0, MAX_SECONDS),
        link_seconds=_optional(d, "link_seconds", 0.0, MAX_SECONDS) or 0.0,
        one_arch_per_unit=d.get("one_arch_per_unit") is True,
        per_compile=_optional(d, "per_compile", 0.0, 1.0) or 0.0,
        per_compile_measured=shared_read.text(d.get("per_compile_measured", ""), "planner.per_compile_measured", _NOTE),
        node_speeds={shared_read.text(k, "a measured node", _HOST): shared_read.number(v, "a node speed", 0.01, 100.0)
                     for k, v in _mapping(d.get("node_speeds") or {}, "planner.node_speeds", 256).items()},
        subsets=subsets,
        shards=unit_costs.ShardModel(kinds, shared_read.text(shards.get("measured", ""), "planner.shards.measured", _NOTE))
        if kinds else None,
        measured=shared_read.text(d.get("measured", ""), "planner.measured", _NOTE))


def from_json(d: object, path: Path) -> Learned:
    """An entry's values, each of its type and within its bounds (shared_read): ValueError
    names the first that is not."""
    d = _mapping(d, "the entry", 64)
    if d.get("schema") != SCHEMA:
        raise ValueError(f"not a schema {SCHEMA} cost entry")
    # A shipped entry names units its build did not reach (null): planned at the mean of the rest.
    units = {shared_read.unit_name(u): None if s is None else
             shared_read.number(s, f"the seconds of {shared_read.shown(u)}", 0.0, MAX_SECONDS)
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
         for u, n in _mapping(d.get("part_limits", {}), "part_limits", MAX_UNITS).items()},
        None if d.get("planner") is None else model_from_json(d["planner"]))


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
    """While the body runs, `load` falls back, for the recipe in `recipe_dir` (by its package
    name), to the costs its folder ships (RECIPE_FILE: a store entry its author's build
    measured), so that a site's first build of it is planned from real numbers; the site's own
    entry, once it has one, wins, and is planned with what the shipped entry says of the units."""
    name = recipe_name(_recipe_text(recipe_dir)) or recipe_dir.name
    token = _RECIPE_DIRS.set({**_RECIPE_DIRS.get(), name: recipe_dir})
    try:
        yield
    finally:
        _RECIPE_DIRS.reset(token)


def _recipe_text(recipe_dir: Path) -> str:
    """The folder's recipe.yaml, or nothing where it has none."""
    with contextlib.suppress(OSError):
        return (recipe_dir / "recipe.yaml").read_text()
    return ""


def load(recipe: str, version: str | None = None, store: Path | None = None) -> Learned | None:
    """The entry for the package `recipe` at `version`; without a version (or none stored for
    it), the most recently measured version (its units are the likeliest to match); without any,
    what the recipe folder ships (recipe_costs). A site's entry is completed by the shipped one
    of the same version: the units it did not build (a subset build's), and what the recipe's
    data says of them. Entries stored under the recipe's folder name (before costs were keyed by
    package name) are read too."""
    shipped_dir = _RECIPE_DIRS.get().get(recipe)
    site = []
    for name in dict.fromkeys([recipe, *([shipped_dir.name] if shipped_dir else [])]):
        folder = (store or root()) / name
        # Only names the store writes: a planted name (a terminal escape) is not even named.
        if _NAME.fullmatch(name) and folder.is_dir():
            site += [e for p in sorted(folder.glob("*.json")) if _NAME.fullmatch(p.stem) and (e := _read(p))]
    shipped = _read(shipped_dir / RECIPE_FILE) if shipped_dir else None
    exact = [e for e in [*site, *filter(None, [shipped])] if version and e.version == version]
    chosen = max(exact or site, key=lambda e: e.measured_at, default=shipped)
    if chosen is None or shipped is None or chosen is shipped or shipped.model is None:
        return chosen
    # The site's seconds, on its own node's scale: a unit it did not build is planned at the mean
    # of those it did; the shipped nodes' speeds were measured against other seconds.
    missing = dict.fromkeys(u for u in shipped.units if u not in chosen.units) if shipped.version == chosen.version else {}
    return dataclasses.replace(chosen, units={**chosen.units, **missing},
                               model=dataclasses.replace(shipped.model, node_speeds={}))


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
        {u: split.seconds.get(u, s) for u, s in units.items()}, unit_costs.compile_seconds(edges),
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


def _literal(recipe_text: str, key: str) -> str | None:
    """The recipe's context or package `key` where it is a literal (None where it is a template
    the recipe's variables decide)."""
    with contextlib.suppress(YAMLError):
        d = YAML(typ="safe").load(recipe_text)
        if isinstance(d, dict):
            for section in ("context", "package"):
                value = (d.get(section) or {}).get(key)
                if value is not None and "${{" not in str(value):
                    return str(value)
    return None


def recipe_version(recipe_text: str) -> str | None:
    """The version a recipe's costs are stored under."""
    return _literal(recipe_text, "version")


def recipe_name(recipe_text: str) -> str | None:
    """The package name a recipe's costs are stored under (not its folder's: a folder renamed
    keeps what its builds taught the store)."""
    return _literal(recipe_text, "name")
