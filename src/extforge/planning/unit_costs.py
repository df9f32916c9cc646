"""Per-translation-unit compile costs: read from ninja's `.ninja_log`, kept as data, and used
to start the longest units first and to predict a build's wall time.

A recipe of many independent compiles whose costs differ (flash-attn: 73 units, ~3x apart)
finishes late when its longest units start last: ninja starts ready edges in the order of
build.ninja, which torch's BuildExtension writes in the order of the sources setuptools hands it,
sorted by name. Started longest first (LPT; a recipe-side step keeps that order through
setuptools' sort, given EXTFORGE_UNIT_ORDER), the tail is short and the wall time is close to
sum/jobs.

The data is a recipe's: what a site's builds taught the cost store (extforge.planning.cost_store), or
what the recipe folder ships (its build-costs.json, the same format plus what its author knows
of its units: which units a subset variant builds, which it can split). A unit whose seconds
are not measured (null) is planned at the mean of the measured ones.

A unit compiles slower the more compile beside it (memory bandwidth, last-level cache, SMT
siblings): one flash-attn unit took 1.35x as long with 32 copies at once as with 16 on one node.
The data's seconds are therefore seconds at a reference number of compiles at once, and
`Concurrency` scales them to the number running at each moment of a schedule.

A setuptools build of several extensions (torch-scatter: eight) runs one ninja per extension,
one after another, each appending to the same `.ninja_log` with times counted from its own
start. The log's mtime column (a wall clock: as each edge started, or as its output was written
in older logs) places every run on one clock, and the planner schedules each run's units apart
and adds the runs up.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..errors import ExtforgeError

# The second translation unit of a unit sharded in two (the recipe-side step that shards units
# names it so; recipe/flash-attn/shard_units.py).
SHARD_SUFFIX = "_shard1"
# A part of a unit compiled as parallel parts (split_in_parts), in the planner's schedule.
PART_SUFFIX = "#part"
# The share of a unit each of its parts repeats (headers, host code): causal-conv1d 1.7.0's
# backward unit for sm_90 on 2 cores: its two halves 285.6 s and 330.9 s at once (1.0 and 1.1 GiB),
# whole 697.6 s (2.0 GiB; a compression ran beside it for ~2 of its ~11 minutes).
PART_REPEAT = 0.05


@dataclass(frozen=True)
class NinjaEdge:
    output: str
    start_ms: int  # on the clock of the log's first ninja run
    end_ms: int
    run: int = 0  # which ninja run of the build, in the order they ran
    # The same output compiled again, with another command, by a later run (torch-scatter builds
    # each source into a CPU and a CUDA extension, both to one object path): its 2nd, 3rd... compile.
    repeat: int = 1

    @property
    def unit(self) -> str:
        return unit_name(self.output) + (f"@{self.repeat}" if self.repeat > 1 else "")

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000.0


@dataclass(frozen=True)
class ShardKind:
    """A kind of unit the recipe can shard in two translation units (its names start with
    `prefix`): each half repeats `repeated` of the unit's seconds (headers, the front end, the
    code both sides share), and the second half takes `twin_share` of the rest."""

    prefix: str
    repeated: float
    twin_share: float


@dataclass(frozen=True)
class ShardModel:
    """What splitting a unit in two translation units costs, per kind of unit (the recipe's data:
    flash-attn's forward units split on their dropout switch, its split-kv ones on theirs)."""

    kinds: dict[str, ShardKind]
    measured: str = ""

    def kind(self, unit: str) -> ShardKind | None:
        """The kind of `unit` (the longest prefix that names it); None: it cannot be split."""
        if unit.endswith(SHARD_SUFFIX):
            return None
        return max((k for k in self.kinds.values() if unit.startswith(k.prefix)), key=lambda k: len(k.prefix), default=None)

    def halves(self, unit: str, seconds: float) -> tuple[float, float] | None:
        """(the unit's, its twin's) seconds once split; None if this unit cannot be split."""
        kind = self.kind(unit)
        if kind is None:
            return None
        fixed, rest = seconds * kind.repeated, seconds * (1 - kind.repeated)
        return fixed + rest * (1 - kind.twin_share), fixed + rest * kind.twin_share


@dataclass(frozen=True)
class Concurrency:
    """How a unit's compile time grows with the compiles running beside it: at c compiles at once
    it takes (1 + per_compile * (c - 1)) / (1 + per_compile * (reference - 1)) times its seconds in
    the data, which are seconds at `reference` compiles at once (`at_reference`)."""

    reference: int
    per_compile: float
    measured: str = ""

    def factor(self, compiles: float) -> float:
        return (1 + self.per_compile * (max(compiles, 1.0) - 1)) / (1 + self.per_compile * (self.reference - 1))


@dataclass(frozen=True)
class UnitCosts:
    """One recipe's units and their measured seconds (None: not measured), with what its data
    says of them."""

    profile: str
    units: dict[str, float | None]
    archs: tuple[str, ...] = ()
    measured: str | None = None  # where and when, for the measured ones
    shards: ShardModel | None = None  # None: the recipe cannot split its units
    concurrency: Concurrency | None = None  # None: units take their seconds whatever runs beside them
    node_speeds: dict[str, float] = field(default_factory=dict)  # measured nodes against `units`
    # variant key -> value -> name parts of the units only that value builds (a subset recipe:
    # FA3's fa3_dtypes fp8 -> "_e4m3_"); in_variant() drops the units of the values left out.
    subsets: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    # The units of each ninja run, where the build ran several one after another (setuptools: one
    # per extension); () when every unit can run beside every other.
    runs: tuple[tuple[str, ...], ...] = ()
    # The units the build layer may compile as parallel parts (split_in_parts): the parts each
    # can have, as a build counted them. None: the units are not split so.
    part_limits: dict[str, int] | None = None

    @property
    def any_measured(self) -> bool:
        return any(s is not None for s in self.units.values())

    def seconds(self) -> dict[str, float]:
        """Every unit's cost: measured where known, else the mean of the measured units (with
        none measured, 1.0 each, for the caller to scale)."""
        known = [s for s in self.units.values() if s is not None]
        mean = sum(known) / len(known) if known else 1.0
        return {u: mean if s is None else s for u, s in self.units.items()}


def shard_units(per_unit: Mapping[str, float], jobs: int, model: ShardModel | None,
                min_gain: float = 0.02, concurrency: Concurrency | None = None) -> tuple[dict[str, float], list[str]]:
    """Shard the longest units in two while that shortens the longest-first schedule by at
    least `min_gain` of it: a build with fewer long units than job slots (a head-dim subset)
    otherwise waits for its longest unit on an idle node. A full build, whose slots stay busy,
    splits nothing. Returns the per-unit seconds with the twins and the units split."""
    costs, split = dict(per_unit), list[str]()
    if model is None:
        return costs, split
    span = lpt_makespan(costs, jobs, concurrency)
    for unit in longest_first(per_unit):
        halves = model.halves(unit, costs[unit])
        if halves is None:
            continue
        trial = {**costs, unit: halves[0], unit + SHARD_SUFFIX: halves[1]}
        trial_span = lpt_makespan(trial, jobs, concurrency)
        if trial_span > span * (1 - min_gain):
            break
        costs, span = trial, trial_span
        split.append(unit)
    return costs, split


def part_name(unit: str, k: int) -> str:
    return f"{unit}{PART_SUFFIX}{k}"


def with_parts(costs: Mapping[str, float], runs: Sequence[Sequence[str]], unit: str,
               k: int) -> tuple[dict[str, float], tuple[tuple[str, ...], ...]]:
    """`costs` and `runs` with `unit` as `k` parts compiled at once, each its share of the unit
    plus PART_REPEAT of it (the front end every part repeats)."""
    names = [part_name(unit, i) for i in range(1, k + 1)]
    return ({u: s for u, s in costs.items() if u != unit} | dict.fromkeys(names, costs[unit] * (1 / k + PART_REPEAT)),
            tuple(tuple(n for u in r for n in (names if u == unit else [u])) for r in runs))


@dataclass(frozen=True)
class Parts:
    """A schedule with units compiled as parallel parts (split_in_parts)."""

    costs: dict[str, float]  # per unit, the parts named part_name(unit, i) in place of their unit
    parts: dict[str, int]  # the units split, and into how many parts
    runs: tuple[tuple[str, ...], ...]  # the build's ninja runs, naming the parts
    processes: int  # compiles at once at most: the jobs and every part beyond a unit's first


def split_in_parts(per_unit: Mapping[str, float], jobs: int, cores: int, runs: Sequence[Sequence[str]] = (),
                   limits: Mapping[str, int] | None = None, concurrency: Concurrency | None = None,
                   memory_room: int | None = None, min_gain: float = 0.02) -> Parts:
    """Any recipe's units compiled as parallel parts (the build layer's split_unit.py deals a
    unit's explicit instantiations), the longest first, each into the number of parts that
    shortens the schedule most, while that shortens it by at least `min_gain` (parts as
    with_parts models them). A unit's parts
    run inside one of ninja's `jobs` slots, so each part beyond the first is a compile beside
    them, and the schedule gets as many more slots: on spare cores, up to the `cores`; on a
    machine with none to spare, two parts, whose compiles share the cores with the others (as
    the learned seconds of such a build were measured: 2 cores, causal-conv1d, within 5%).
    `limits`: the parts a unit can have (its instantiations, as an earlier build counted them);
    a unit it does not name is not split; `memory_room`: the most compiles memory allows beside the jobs."""
    costs, parts, now_runs = dict(per_unit), dict[str, int](), tuple(tuple(r) for r in runs)
    cpu_room = max(0, cores - jobs)
    mem_room = cores if memory_room is None else memory_room
    added = 0
    span = runs_makespan(costs, jobs, concurrency, now_runs)
    for unit in longest_first(per_unit):
        best: tuple[float, int, dict[str, float], tuple[tuple[str, ...], ...]] | None = None
        most = min((limits or {}).get(unit, 1), 1 + mem_room - added, max(2, 1 + cpu_room - added))
        for k in range(2, most + 1):
            trial, trial_runs = with_parts(costs, now_runs, unit, k)
            trial_span = runs_makespan(trial, jobs + added + k - 1, concurrency, trial_runs)
            if best is None or trial_span < best[0]:
                best = (trial_span, k, trial, trial_runs)
        if best is None or best[0] > span * (1 - min_gain):
            break
        span, parts[unit], costs, now_runs = best
        added += parts[unit] - 1
    return Parts(costs, parts, now_runs, jobs + added)


def joined(per_unit: Mapping[str, float], model: ShardModel | None) -> dict[str, float]:
    """Measured seconds of a build that split units, as the unsplit units would have cost: a
    unit and its twin together repeat `model`'s share of it once more."""
    out = {u: s for u, s in per_unit.items() if not u.endswith(SHARD_SUFFIX)}
    for u, s in per_unit.items():
        if u.endswith(SHARD_SUFFIX) and (main := u[: -len(SHARD_SUFFIX)]) in out:
            kind = model.kind(main) if model else None
            out[main] = (out[main] + s) / (1 + (kind.repeated if kind else 0.0))
    return out


def unit_name(path: str) -> str:
    """`.../csrc/flash_attn/src/flash_bwd_hdim128_fp16_sm80.o` or `....cu` → `flash_bwd_hdim128_fp16_sm80`."""
    name = PurePosixPath(path).name
    for suffix in (".o", ".obj", ".cu", ".cpp", ".cc", ".cxx"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def parse_ninja_log(text: str) -> list[NinjaEdge]:
    """Edges of a `.ninja_log` (v5-v7: start, end, mtime, output, command hash; tab-separated).
    ninja appends on every build. Several ninja runs in one log are put on the first run's clock
    (`on_one_clock`); an output built again by the same command (an incremental rebuild) counts
    once, at its last entry, while one built again by another command (another extension's
    flags) is another compile."""
    lines = text.splitlines()
    head = re.match(r"#\s*ninja log v(\d+)", lines[0]) if lines else None
    if not head:
        raise ExtforgeError("not a ninja log", "the first line is not '# ninja log vN'",
                            "pass the .ninja_log from the build folder (build/temp.*/.ninja_log)")
    entries: list[LogEntry] = []
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        entries.append(LogEntry(parts[3], int(parts[0]), int(parts[1]), int(parts[2]) if parts[2].isdigit() else 0,
                                parts[4] if len(parts) > 4 else ""))
    return sorted(on_one_clock(entries, mtime_at_start=int(head[1]) >= 6), key=lambda e: (e.start_ms, e.output))


@dataclass(frozen=True)
class LogEntry:
    output: str
    start_ms: int  # on its own ninja run's clock
    end_ms: int
    mtime: int
    command: str  # the command's hash


# Within one ninja run, the logged wall clock and ninja's own time of the edge differ by the
# filesystem clock's tick and the moment ninja reaps the compiler: milliseconds, far less than
# the gap between two runs (a link at least). ninja < 1.10 wrote whole seconds.
_RUN_GAP_MS = 1000


def on_one_clock(entries: Sequence[LogEntry], mtime_at_start: bool) -> list[NinjaEdge]:
    """Edges from the log's entries: grouped into ninja runs by the wall clock of each run's
    start (mtime less the edge's start where ninja logs the wall clock as the edge started, log
    v6 on; less its end where it logs the output's mtime, v5), each run shifted onto the first's
    clock. Without mtimes, one run as logged."""
    if not entries or not all(e.mtime for e in entries):
        return list({e.output: NinjaEdge(e.output, e.start_ms, e.end_ms) for e in entries}.values())
    seconds = min(e.mtime for e in entries) < 10**15  # ninja >= 1.10 writes nanoseconds
    offsets = [(e.mtime * 1000 if seconds else e.mtime // 10**6) - (e.start_ms if mtime_at_start else e.end_ms)
               for e in entries]
    starts: list[int] = []  # each run's start on the wall clock, in ms
    for off in sorted(offsets):
        if not starts or off - starts[-1] > _RUN_GAP_MS * (2 if seconds else 1):
            starts.append(off)
    runs = [bisect.bisect_right(starts, off) - 1 for off in offsets]
    latest: dict[tuple[str, str], tuple[int, LogEntry]] = {}  # (output, command) -> its last compile
    for run, e in sorted(zip(runs, entries, strict=True), key=lambda re_: (re_[0], re_[1].start_ms)):
        latest.pop((e.output, e.command), None)
        latest[(e.output, e.command)] = (run, e)
    edges, seen = [], collections.Counter[str]()
    for run, e in latest.values():
        seen[e.output] += 1
        shift = starts[run] - starts[0]
        edges.append(NinjaEdge(e.output, e.start_ms + shift, e.end_ms + shift, run, seen[e.output]))
    return edges


def ninja_runs(edges: Sequence[NinjaEdge]) -> tuple[tuple[str, ...], ...]:
    """The units of each ninja run in the order they started; () for a log of one run."""
    if len({e.run for e in edges}) < 2:
        return ()
    runs: dict[int, list[NinjaEdge]] = {}
    for e in sorted(edges, key=lambda e: (e.start_ms, e.output)):
        runs.setdefault(e.run, []).append(e)
    return tuple(tuple(e.unit for e in runs[r]) for r in sorted(runs))


def compile_seconds(edges: Sequence[NinjaEdge]) -> float:
    """Seconds of compiling: each run's first start to its last end, added up (what runs between
    two ninja runs, setuptools linking the previous extension, is not compiling)."""
    spans: dict[int, tuple[int, int]] = {}
    for e in edges:
        lo, hi = spans.get(e.run, (e.start_ms, e.end_ms))
        spans[e.run] = (min(lo, e.start_ms), max(hi, e.end_ms))
    return round(sum(hi - lo for lo, hi in spans.values()) / 1000, 1)


def cache_hits(verdicts: Iterable[tuple[str, str]]) -> set[str]:
    """The units a build took from the compile cache, as NinjaEdge.unit names them, by ccache's
    verdict on each call (parts.read_verdicts): the n-th call on a source is its n-th compile."""
    seen = collections.Counter[str]()
    hits = set()
    for source, verdict in verdicts:
        name = unit_name(source)
        seen[name] += 1
        if verdict == "hit":
            hits.add(name + (f"@{seen[name]}" if seen[name] > 1 else ""))
    return hits


def unit_seconds(edges: Iterable[NinjaEdge]) -> dict[str, float]:
    return {e.unit: round(e.seconds, 1) for e in edges}


@dataclass(frozen=True)
class Schedule:
    makespan: float
    slots: list[list[str]]  # units per job slot, in start order
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # unit -> (start, end) seconds


def list_schedule(costs: Sequence[tuple[str, float]], jobs: int, concurrency: Concurrency | None = None) -> Schedule:
    """Greedy list scheduling, as ninja does: each unit, in the given order, starts on the slot
    that frees up first. Given the units longest first, this is the LPT schedule (makespan at
    most 4/3 of the optimum, without `concurrency`). With `concurrency`, the units running at
    each moment progress at the pace that so many compiles at once allow (costs are seconds at
    its reference), so a build's tail, with fewer compiles left, runs faster than its start."""
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    slots: list[list[str]] = [[] for _ in range(jobs)]
    free = list(range(jobs))  # idle slots, lowest first
    running: dict[int, float] = {}  # slot -> reference seconds left
    spans: dict[str, tuple[float, float]] = {}
    queue, now = list(costs), 0.0
    while queue or running:
        while queue and free:
            slot = heapq.heappop(free)
            unit, seconds = queue.pop(0)
            slots[slot].append(unit)
            running[slot] = seconds
            spans[unit] = (now, now)
        factor = concurrency.factor(len(running)) if concurrency else 1.0
        step = min(running.values())
        now += step * factor
        for slot in list(running):
            running[slot] -= step
            if running[slot] <= 1e-9 * max(step, 1.0):
                del running[slot]
                heapq.heappush(free, slot)
                spans[slots[slot][-1]] = (spans[slots[slot][-1]][0], now)
    return Schedule(makespan=now, slots=slots, spans=spans)


def longest_first(costs: Mapping[str, float]) -> list[str]:
    """Units by decreasing cost; ties by name, so the order is reproducible."""
    return sorted(costs, key=lambda u: (-costs[u], u))


def lpt_makespan(costs: Mapping[str, float], jobs: int, concurrency: Concurrency | None = None) -> float:
    return list_schedule([(u, costs[u]) for u in longest_first(costs)], jobs, concurrency).makespan


def in_runs(per_unit: Mapping[str, float], runs: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """`per_unit` split into the build's ninja runs, in order, each run's units in the order the
    measured build started them (setuptools sorts an extension's sources by path); units no run
    names (every unit of a one-run build, or a variant's the measured build lacked) run last,
    together, in name order."""
    named = {u for run in runs for u in run}
    groups = [{u: per_unit[u] for u in run if u in per_unit} for run in runs]
    groups.append({u: per_unit[u] for u in sorted(per_unit) if u not in named})
    return [g for g in groups if g]


def runs_makespan(per_unit: Mapping[str, float], jobs: int, concurrency: Concurrency | None = None,
                  runs: Sequence[Sequence[str]] = (), upstream_order: bool = False) -> float:
    """The compile span of a build whose units run in ninja runs one after another (one run: the
    whole build), each run's units started longest first, or in upstream's order (in_runs)."""
    return sum(list_schedule(list(g.items()) if upstream_order else [(u, g[u]) for u in longest_first(g)],
                             jobs, concurrency).makespan for g in in_runs(per_unit, runs))


def running_counts(edges: Sequence[NinjaEdge]) -> list[tuple[float, int]]:
    """(seconds since the first start, compiles running from then on), at every start and end."""
    if not edges:
        return []
    t0 = min(e.start_ms for e in edges)
    events = sorted([(e.start_ms - t0, 1) for e in edges] + [(e.end_ms - t0, -1) for e in edges])
    out: list[tuple[float, int]] = []
    running = 0
    for ms, delta in events:
        running += delta
        if out and out[-1][0] == ms / 1000.0:
            out[-1] = (ms / 1000.0, running)
        else:
            out.append((ms / 1000.0, running))
    return out


def at_reference(edges: Sequence[NinjaEdge], concurrency: Concurrency,
                 load: Sequence[tuple[float, float]] = ()) -> dict[str, float]:
    """Each edge's seconds as they would have been at `concurrency.reference` compiles at once:
    the integral over its run of 1 / factor(compiles running then). The compiles running are
    the log's own, or where `load` (seconds since the log's first start, compiles counted on the
    machine) counts more (another build beside this one), that count."""
    if not edges:
        return {}
    t0 = min(e.start_ms for e in edges)
    own = running_counts(edges)
    points = sorted({t for t, _ in own} | {t for t, _ in load})

    def level(series: Sequence[tuple[float, float]], t: float) -> float:
        i = bisect.bisect_right(series, (t, math.inf)) - 1
        return series[i][1] if i >= 0 else 0.0

    starts = points[:-1]
    pieces = [(a, b, 1 / concurrency.factor(max(level(own, a), level(load, a)))) for a, b in zip(points, points[1:])]
    out: dict[str, float] = {}
    for e in edges:
        start, end = (e.start_ms - t0) / 1000.0, (e.end_ms - t0) / 1000.0
        first = max(0, bisect.bisect_right(starts, start) - 1)
        last = bisect.bisect_left(starts, end)
        out[e.unit] = round(sum((min(b, end) - max(a, start)) * pace for a, b, pace in pieces[first:last]
                                if b > start and a < end), 1)
    return out


def node_speed(edges: Sequence[NinjaEdge], data: Mapping[str, float], concurrency: Concurrency,
               load: Sequence[tuple[float, float]] = ()) -> tuple[float, int]:
    """How fast the node of a log compiles against the data: the median, over the units both
    name, of the log's seconds (brought to the data's compiles at once) over the data's; and how
    many units that is. The median, so that a unit slowed by something else running does not
    move it."""
    mine = at_reference(edges, concurrency, load)
    ratios = sorted(mine[u] / data[u] for u in mine if data.get(u))
    if not ratios:
        raise ValueError("the log names none of the data's units")
    mid = len(ratios) // 2
    return (ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2), len(ratios)


def fit_concurrency(runs: Sequence[tuple[Sequence[NinjaEdge], Sequence[tuple[float, float]]]], reference: int,
                    measured: str = "") -> Concurrency:
    """The slowdown per extra compile that makes the units two or more builds share (run at
    different numbers of compiles at once) cost the same at the reference: least squares over
    the log of each shared unit's reference seconds against the first run's."""
    if len(runs) < 2:
        raise ValueError("fitting a slowdown needs two builds that ran the same units at different concurrency")

    def misfit(per_compile: float) -> float:
        c = Concurrency(reference, per_compile)
        base, *others = [at_reference(edges, c, load) for edges, load in runs]
        return sum(math.log(base[u] / other[u]) ** 2 for other in others for u in base.keys() & other.keys()
                   if base[u] > 0 and other[u] > 0)

    lo, hi = 0.0, 0.2  # golden-section search: the misfit has one minimum in a range this wide
    ratio = (math.sqrt(5) - 1) / 2
    while hi - lo > 1e-5:
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, b) if misfit(a) <= misfit(b) else (a, hi)
    return Concurrency(reference, round((lo + hi) / 2, 4), measured)


def _chosen(value: object) -> set[str] | None:
    """The values a variant key names ("bf16;fp8", a matrix's list of them); None: every value."""
    out: set[str] = set()
    for item in value if isinstance(value, list | tuple) else [value]:
        for v in str(item).split(";") if item is not None else ["all"]:
            if v.strip() in ("", "all"):
                return None
            out.add(v.strip())
    return out


def in_variant(per_unit: Mapping[str, float], subsets: Mapping[str, Mapping[str, Sequence[str]]],
               variant: Mapping[str, object]) -> dict[str, float]:
    """Only the units a subset variant compiles: a unit whose name holds a part of a value the
    variant leaves out is not built. A key the variant does not set, or sets to "all", builds every unit."""
    drop = [part for key, values in subsets.items() if key in variant and (chosen := _chosen(variant[key])) is not None
            for value, parts in values.items() if value not in chosen for part in parts]
    return {u: s for u, s in per_unit.items() if not any(part in u for part in drop)}
