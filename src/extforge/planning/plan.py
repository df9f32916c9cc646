"""Resource planner: MAX_JOBS and NVCC_THREADS that cannot run a build out of memory.

nvcc on a template-heavy kernel peaks at ~4.3 GB per job; torch's default MAX_JOBS is the core
count, which on a 16-core/64 GB node means an OOM kill halfway through a 20-minute build.
The planner picks, among the settings whose predicted peak fits the memory limit (minus
headroom for the final link and the OS), the fastest; ties go to the lower peak.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources

from ruamel.yaml import YAML

from ..errors import ExtforgeError
from ..machine import GIB, Machine
from . import cost_store, unit_costs

DEFAULT_ARCHS: tuple[str, ...] = ("80", "90")
# The name to plan under for no recipe in particular (`extforge doctor`): the default profile.
UNMEASURED = "an extension nobody measured"


@dataclass(frozen=True)
class BuildProfile:
    name: str
    translation_units: int
    per_job_peak_gib: float
    per_extra_thread_gib: float
    seconds_per_unit_arch: float
    link_seconds: float
    # Each unit compiles for one arch of its own: the unit count already holds every arch's
    # units, so more archs add no work per unit and nvcc --threads has nothing to run in parallel.
    one_arch_per_unit: bool = False

    def work_archs(self, archs: Sequence[str]) -> int:
        """How many archs one unit compiles for when the build targets `archs`."""
        return 1 if self.one_arch_per_unit else max(1, len(archs))


@dataclass(frozen=True)
class BuildPlan:
    profile: str
    archs: tuple[str, ...]
    cores: int
    max_jobs: int
    nvcc_threads: int
    predicted_peak_bytes: int
    memory_limit_bytes: int
    expected_wall_seconds: int
    reasons: list[str] = field(default_factory=list)
    # The same build with the units started in upstream's order (None: no per-unit data).
    upstream_order_wall_seconds: int | None = None
    # The translation units, longest first (empty: no per-unit data), and those sharded in two.
    unit_order: tuple[str, ...] = ()
    shard_units: tuple[str, ...] = ()
    # Units the build layer compiles as parallel parts, and into how many (any learned recipe),
    # and the cores their parts keep busy beside the jobs.
    split_units: tuple[tuple[str, int], ...] = ()
    split_cores: int = 0
    # The wall time on the slowest and fastest nodes measured (None: no node speeds, or --node-speed).
    wall_range_seconds: tuple[int, int] | None = None
    # Where the numbers come from: shipped, learned on a date from N units, or the default estimate.
    numbers_from: str = ""

    def job_env(self) -> dict[str, str]:
        """The settings any torch extension build takes (pip, setup.py)."""
        return {"MAX_JOBS": str(self.max_jobs), "NVCC_THREADS": str(self.nvcc_threads)}

    def env(self) -> dict[str, str]:
        """What the recipe's build script reads: the job settings, the order ninja starts the
        units in (setup.py's source order), and the units to shard in two translation units."""
        env = self.job_env()
        if self.unit_order:
            env["EXTFORGE_UNIT_ORDER"] = ";".join(self.unit_order)
        if self.shard_units:
            env["EXTFORGE_SHARD_UNITS"] = ";".join(self.shard_units)
        if self.split_units:
            env["EXTFORGE_SPLIT_UNITS"] = ";".join(f"{u}={k}" for u, k in self.split_units)
        return env


@dataclass(frozen=True)
class SlurmRequest:
    cpus_per_task: int
    mem: str  # sbatch syntax, e.g. "80G"
    time: str  # HH:MM:SS

    def sbatch_args(self) -> list[str]:
        return [f"--cpus-per-task={self.cpus_per_task}", f"--mem={self.mem}", f"--time={self.time}"]


def default_profile(name: str) -> BuildProfile:
    """What a recipe nobody measured is planned from (data/build-profiles.yaml), under its name."""
    d = YAML(typ="safe").load(resources.files("extforge").joinpath("data/build-profiles.yaml").read_text())["default"]
    return BuildProfile(name, int(d["translation_units"]), float(d["per_job_peak_gib"]), float(d["per_extra_thread_gib"]),
                        float(d["seconds_per_unit_arch"]), float(d["link_seconds"]))


def unit_seconds(profile: BuildProfile, costs: unit_costs.UnitCosts, n_archs: int, threads: int) -> dict[str, float]:
    """Each unit's compile seconds for `n_archs` archs on `threads` nvcc threads (units nobody
    measured at the profile's seconds per unit and arch)."""
    per_unit = costs.seconds()
    data_archs = max(1, len(costs.archs))
    if not costs.any_measured:
        per_unit, data_archs = {u: s * profile.seconds_per_unit_arch for u, s in per_unit.items()}, 1
    busy = min(threads, n_archs)
    return {u: s * n_archs / data_archs / busy for u, s in per_unit.items()}


def headroom_bytes(memory_bytes: int) -> int:
    """Kept free for the final link of a 200+ MB .so, the OS and page cache."""
    return max(4 * GIB, memory_bytes // 10)


def job_peak_bytes(profile: BuildProfile, threads: int, n_archs: int) -> int:
    extra = max(0, min(threads, n_archs) - 1)
    return int((profile.per_job_peak_gib + extra * profile.per_extra_thread_gib) * GIB)


def wall_seconds(profile: BuildProfile, jobs: int, threads: int, n_archs: int, cores: int) -> float:
    busy_threads = min(threads, n_archs)
    cpu_seconds = profile.translation_units * profile.seconds_per_unit_arch * n_archs
    parallel = min(cores, min(jobs, profile.translation_units) * busy_threads)
    # One unit cannot finish faster than its own archs split over its threads.
    critical = profile.seconds_per_unit_arch * n_archs / busy_threads
    return max(cpu_seconds / parallel, critical) + profile.link_seconds


@dataclass(frozen=True)
class Numbers:
    """What a build is planned from, and where they come from (said by `extforge plan`)."""

    profile: BuildProfile
    costs: unit_costs.UnitCosts | None
    source: str
    units_known: bool = True


def numbers_for(profile: str, version: str | None = None, units: int | None = None) -> Numbers:
    """The numbers for a build of `profile` (a recipe's package name) at `version`: what the
    site's cost store learned from an earlier build of the recipe, else what the recipe folder
    ships (cost_store.recipe_costs), else the default estimate, over `units` translation units
    where known."""
    default = default_profile(profile)
    learned = cost_store.load(profile, version)
    if learned is None:
        p = replace(default, translation_units=units or 0)
        return Numbers(p, None, f"default estimate (no measured costs for {profile}: per job as the default profile's "
                                f"measured units, data/build-profiles.yaml; {cost_store.root()} has none yet)",
                       units_known=bool(units))
    return learned_numbers(profile, learned, version)


def learned_numbers(profile: str, learned: cost_store.Learned, version: str | None = None) -> Numbers:
    """The numbers for a build of `profile` from a measured build of it (the cost store's, or its
    recipe folder's entry, with what that says of the units)."""
    default = default_profile(profile)
    model = learned.model or cost_store.RecipeModel()
    peak = learned.largest_process_bytes
    # Each extra nvcc thread compiles another arch beside the first: one more largest process.
    per_job = model.per_job_peak_gib or (peak * cost_store.LEARNED_PEAK_MARGIN / GIB if peak else default.per_job_peak_gib)
    costs = learned.costs()
    busy_seconds = sum(s for s in costs.seconds().values())
    # The ninja log holds the compiles only; setuptools links after it (a recipe's data may say how long).
    p = BuildProfile(profile, len(costs.units), per_job,
                     per_job if model.per_extra_thread_gib is None else model.per_extra_thread_gib,
                     model.seconds_per_unit_arch or busy_seconds / len(costs.units) / max(1, len(learned.archs)),
                     model.link_seconds, model.one_arch_per_unit)
    version_note = "" if learned.version == version or version is None else f", of version {learned.version}"
    peak_note = (f"a job peaks at {model.per_job_peak_gib:.1f} GiB (the recipe's data)"
                 if model.per_job_peak_gib else f"largest compiler process {peak / GIB:.1f} GiB" if peak else
                 f"no process peak measured, {default.per_job_peak_gib:.1f} GiB per job as the default profile")
    return Numbers(p, costs, f"{learned.describe()}{version_note}; {peak_note}")


def plan_build(machine: Machine, profile: str, archs: tuple[str, ...] | list[str] = DEFAULT_ARCHS,
               node_speed: float = 1.0, version: str | None = None, units: int | None = None,
               variant: Mapping[str, object] | None = None) -> BuildPlan:
    """`node_speed`: this node's compile seconds per second of the data's (0.7: its CPU compiles
    a unit in 0.7 of the time). Nodes of one kind differ (up to 1.5x between two 16-core H100
    nodes on the same unit), so a site that has one build's ninja log from a node type passes its speed
    (`extforge plan --node-speed-from LOG` reads it) to predict that node type within a few percent.
    `version`, `units`: the recipe's version and its translation units where nothing is
    measured (numbers_for). `variant`: the variant's values, for a recipe whose cost data says
    which units a subset key leaves out (unit_costs.in_variant)."""
    if node_speed <= 0:
        raise ValueError("node_speed must be positive")
    numbers = numbers_for(profile, version, units)
    p = numbers.profile
    if not numbers.units_known:
        # Without a unit count, as many units as the machine can run at once: one wave.
        p = replace(p, translation_units=machine.cores)
    archs = tuple(archs) or DEFAULT_ARCHS
    n_archs = p.work_archs(archs)
    limit = machine.memory_bytes - headroom_bytes(machine.memory_bytes)
    costs = numbers.costs
    # setuptools' extensions, one ninja run each in a plain build, compile in one ninja run under
    # the build layer (extforge_build_ext.py): every unit shares the job slots.
    widest = len(costs.units) if costs and costs.runs else p.translation_units
    candidates = []
    for threads in range(1, n_archs + 1):
        peak_one = job_peak_bytes(p, threads, n_archs)
        max_jobs_memory = limit // peak_one
        jobs = min(max_jobs_memory, max(1, machine.cores // threads), widest)
        if jobs < 1:
            continue
        candidates.append((wall_seconds(p, jobs, threads, n_archs, machine.cores) * node_speed, jobs * peak_one, jobs, threads))
    if not candidates:
        need = job_peak_bytes(p, 1, n_archs) + headroom_bytes(machine.memory_bytes)
        raise ExtforgeError(
            f"{machine.memory_gib:.1f} GiB is not enough to build {profile} (one nvcc job needs "
            f"~{p.per_job_peak_gib:.1f} GiB plus headroom)",
            f"memory limit from {machine.memory_source}",
            f"build on a node with at least {math.ceil(need / GIB)} GiB (extforge plan --memory ...)",
        )
    wall, peak, jobs, threads = min(candidates, key=lambda c: (round(c[0]), c[1]))
    upstream_wall: float | None = None
    wall_range: tuple[int, int] | None = None
    order: tuple[str, ...] = ()
    shards: list[str] = []
    parts: dict[str, int] = {}
    slots = jobs
    if costs:
        in_build = unit_costs.in_variant(unit_seconds(p, costs, n_archs, threads), costs.subsets, variant or {})
        per_unit = {u: s * node_speed for u, s in in_build.items()}
        # What a plain build does: no unit split, the units in setuptools' order (it sorts an
        # extension's sources before torch writes build.ninja; unit_costs.in_runs), and one ninja
        # run per extension, one after another. Every schedule paces the units by the compiles
        # running beside them (costs.concurrency).
        upstream_wall = unit_costs.runs_makespan(per_unit, jobs, costs.concurrency, costs.runs, upstream_order=True) \
            + p.link_seconds
        per_unit, shards = unit_costs.shard_units(per_unit, jobs, costs.shards, concurrency=costs.concurrency)
        runs: tuple[tuple[str, ...], ...] = ()
        if costs.part_limits is not None:
            peak_one = job_peak_bytes(p, threads, n_archs)
            split_plan = unit_costs.split_in_parts(per_unit, jobs, machine.cores // threads, runs, costs.part_limits,
                                                   costs.concurrency, memory_room=int(limit // peak_one) - jobs)
            per_unit, parts, runs, slots = split_plan.costs, split_plan.parts, split_plan.runs, split_plan.processes
            peak = slots * peak_one
        wall = unit_costs.runs_makespan(per_unit, slots, costs.concurrency, runs) + p.link_seconds
        order = tuple(dict.fromkeys(u.split(unit_costs.PART_SUFFIX)[0] for u in unit_costs.longest_first(per_unit)))
        if costs.node_speeds and node_speed == 1.0:
            spans = [unit_costs.runs_makespan({u: sec * speed for u, sec in per_unit.items()}, slots,
                                              costs.concurrency, runs)
                     for speed in (min(costs.node_speeds.values()), max(costs.node_speeds.values()))]
            wall_range = (int(round(spans[0] + p.link_seconds)), int(round(spans[1] + p.link_seconds)))
    reasons = [
        f"numbers: {numbers.source}",
        f"{machine.cores} cores ({machine.cores_source}), {machine.memory_gib:.1f} GiB ({machine.memory_source})",
        f"memory limit {limit / GIB:.1f} GiB = memory - {headroom_bytes(machine.memory_bytes) / GIB:.1f} GiB "
        "headroom for the link and the OS",
        f"one nvcc job peaks at ~{job_peak_bytes(p, threads, n_archs) / GIB:.1f} GiB "
        f"({profile}, {n_archs} arch(s) per unit, {threads} nvcc thread(s))",
        (f"{p.translation_units} translation units" if numbers.units_known else
         "unit count unknown, taken as one wave over the job slots") +
        f" x {n_archs} arch(s) per unit x ~{p.seconds_per_unit_arch:.0f} s"
        if not costs else
        f"{len(per_unit)} translation units, per-unit costs "
        f"{'measured (' + str(costs.measured) + ')' if costs.any_measured else 'none measured'}, "
        f"started longest first over {jobs} job slots (upstream's order: ~{upstream_wall:.0f} s)",
    ]
    if costs and costs.concurrency and costs.concurrency.per_compile:
        cc, busy = costs.concurrency, min(jobs, len(per_unit))
        reasons.append(f"with {busy} compiles at once a unit takes {cc.factor(busy):.2f}x as long as with {cc.reference} "
                       f"(+{100 * cc.per_compile:.2f}% per compile, from {cc.measured or 'node builds'})")
    if node_speed != 1.0:
        reasons.append(f"this node compiles a unit in {node_speed:.2f}x the data's seconds (--node-speed)")
    elif wall_range and costs:
        reasons.append(f"nodes measured so far compile at {min(costs.node_speeds.values()):.2f}-"
                       f"{max(costs.node_speeds.values()):.2f}x the data's seconds ({'; '.join(costs.node_speeds)}): "
                       "pass --node-speed for a node type measured once")
    if costs and costs.runs:
        reasons.append(f"setuptools' {len(costs.runs)} extensions compile in one ninja run (the build layer), their "
                       f"units sharing the {jobs} job slots; a plain build runs one ninja per extension, one after another")
    if shards:
        reasons.append(f"{len(shards)} unit(s) sharded in two translation units, each alone longer than the rest of the "
                       f"schedule: {', '.join(shards)}")
    if parts:
        reasons.append("compiled as parallel parts (their explicit template instantiations dealt out), each alone "
                       f"longer than the rest of the schedule: {', '.join(f'{u} in {k}' for u, k in parts.items())}")
    if jobs * threads < machine.cores and jobs == widest:
        reasons.append(f"the recipe's {jobs} units, not cores, limit parallelism: {jobs} x {threads} of {machine.cores} "
                       "cores busy")
    elif jobs * threads < machine.cores:
        reasons.append(f"memory, not cores, limits parallelism: {jobs} x {threads} of {machine.cores} cores busy")
    return BuildPlan(profile, archs, machine.cores, jobs, threads, peak, limit, int(round(wall)), reasons,
                     None if upstream_wall is None else int(round(upstream_wall)), order, tuple(shards), tuple(parts.items()),
                     max(0, min(slots, machine.cores // threads) - jobs) * threads, wall_range, numbers.source)


def build_node_speed(profile: str, ninja_log: str, archs: Sequence[str], threads: int,
                     load: Sequence[tuple[float, float]] = (), split: Collection[str] = (),
                     version: str | None = None) -> float | None:
    """How fast the machine of a finished build compiled against the planner's costs for it
    (`plan_build(node_speed=...)`), from the build's ninja log (`load`: compiles running that the
    log does not show, see unit_costs.at_reference); None without costs for the profile or units
    to compare. A unit sharded in two is left out (its first half bears the unit's name), and so
    is one the build layer compiled as parallel parts (`split`: its edge times the longest), and
    any unit the caller names there for another reason (a compile-cache hit times a copy)."""
    numbers = numbers_for(profile, version)
    costs = numbers.costs
    if not costs or not costs.concurrency:
        return None
    expected = unit_seconds(numbers.profile, costs, numbers.profile.work_archs(archs), max(1, threads))
    edges = unit_costs.parse_ninja_log(ninja_log)
    split = {*split, *(e.unit.removesuffix(unit_costs.SHARD_SUFFIX) for e in edges if e.unit.endswith(unit_costs.SHARD_SUFFIX))}
    try:
        speed, _ = unit_costs.node_speed(edges, {u: s for u, s in expected.items() if u not in split}, costs.concurrency,
                                         load)
    except ValueError:
        return None
    return round(speed, 3)


@dataclass(frozen=True)
class SecondBuild:
    """How well a recipe's first build predicts its second (`extforge plan --compare`): the
    second build's compile span as measured and as the planner predicts it from the first."""

    first_units: int
    first_jobs: int
    first_compile_seconds: float
    units: int
    runs: int
    jobs: int
    measured_seconds: float
    predicted_seconds: float  # in the order the second build started its units
    longest_first_seconds: float
    parts: dict[str, int]  # units the second build compiled as parallel parts, and into how many
    slots: int  # compiles at once, each part a compile beside those the log shows

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_seconds - self.measured_seconds) / self.measured_seconds

    def lines(self) -> list[str]:
        parts = ", ".join(f"{u} in {k}" for u, k in self.parts.items())
        return [f"first build: {self.first_units} units, {self.first_jobs} at once, compile span "
                f"{self.first_compile_seconds:.1f} s",
                f"second build: {self.units} units in {self.runs} ninja run(s), {self.jobs} at once, compile span "
                f"{self.measured_seconds:.1f} s",
                f"predicted from the first, in the second's start order: {self.predicted_seconds:.1f} s "
                f"(longest first: {self.longest_first_seconds:.1f} s)",
                *([f"second build's units in parallel parts: {parts} ({self.slots} compiles at once)"] if parts else []),
                f"planner error on second build: {100 * self.error:+.1f}%"]


def predict_second_build(first_log: str, second_log: str, archs: Sequence[str], threads: int,
                         second_archs: Sequence[str], second_threads: int, first_split: str = "",
                         second_split: str = "") -> SecondBuild:
    """The planner's error on a learned recipe: the first build's ninja log (and the build layer's
    split log beside it) learned as `extforge build` stores it (in memory, not in the store), the second
    build's compile span predicted from that: its units, at the compiles its log ran at once,
    started in the order its log shows (a recipe that takes EXTFORGE_UNIT_ORDER starts them
    longest first, one that does not in setuptools' order), run by run where the build ran ninja
    once per extension; the units its split log names in parts as the planner models them. The
    measured span is each ninja run's first start to last end, added up; the links are in neither."""
    try:
        learned = cost_store.measure("first-build", "0", first_log, tuple(archs), threads, None, first_split)
    except ValueError as exc:
        raise ExtforgeError("cannot learn from the first build's ninja log", str(exc),
                            "pass the .ninja_log a finished build kept beside its build log") from None
    costs = unit_seconds(learned_numbers("first-build", learned).profile, learned.costs(), len(second_archs),
                         second_threads)
    edges = unit_costs.parse_ninja_log(second_log)
    if not edges:
        raise ExtforgeError("the second build's ninja log has no finished compile", "there is nothing to predict",
                            "pass the .ninja_log a finished build kept beside its build log")
    unknown = [e.unit for e in edges if e.unit not in costs]
    if unknown:
        raise ExtforgeError(f"the second build compiled units the first did not: {', '.join(unknown)}",
                            "the planner predicts a build only from units it has costs for",
                            "compare two builds of the same recipe, version and variant")
    runs = unit_costs.ninja_runs(edges) or (tuple(e.unit for e in edges),)
    parts = cost_store.read_split_log(second_split).parts
    seconds = {e.unit: costs[e.unit] for e in edges}
    for unit, k in parts.items():
        seconds, runs = unit_costs.with_parts(seconds, runs, unit, k)
    jobs = max(n for _, n in unit_costs.running_counts(edges))
    slots = jobs + sum(k - 1 for k in parts.values())
    return SecondBuild(len(learned.units), learned.jobs, learned.compile_seconds, len(edges), len(runs), jobs,
                       unit_costs.compile_seconds(edges),
                       unit_costs.runs_makespan(seconds, slots, runs=runs, upstream_order=True),
                       unit_costs.runs_makespan(seconds, slots, runs=runs), parts, slots)


# A speed from fewer finished units is too noisy to predict from (the first to finish are the
# shortest of the first wave).
MIN_UNITS_FOR_SPEED = 3


@dataclass(frozen=True)
class BuildProgress:
    """A running build's compile step, from its ninja log: units done of the plan's, the ninja run
    compiling now (setuptools runs one per extension, one after another), the speed this machine
    shows on the units done, and the time left."""

    done: int
    total: int | None  # the plan's units (None: the plan could not count them)
    elapsed_seconds: float  # since ninja started
    node_speed: float | None = None
    remaining_seconds: int | None = None
    run: int = 1  # the ninja run compiling now
    runs: int | None = 1  # how many the build runs (None: not known until it ends)
    run_units: tuple[int, int] | None = None  # ninja's own [k/N] of this run, where it printed one

    def describe(self) -> str:
        parts = []
        if self.run > 1 or (self.runs or 1) > 1:
            parts.append(f"ninja run {self.run}" + (f" of {self.runs}" if self.runs and self.run <= self.runs else ""))
        if self.total:
            parts.append(f"units {self.done}/{self.total}")
        else:
            parts.append(f"{self.done} units done" + (f" ({self.run_units[0]}/{self.run_units[1]} of this run)"
                                                     if self.run_units else ""))
        if self.remaining_seconds is not None:
            parts.append(f"~{minutes(self.remaining_seconds)} left" if self.remaining_seconds else "finishing")
        speed = f" (this machine: {self.node_speed:.2f}x the planner's unit costs)" if self.node_speed else ""
        return f"compiling: {', '.join(parts)}{speed}"


def build_progress(machine: Machine, profile: str, archs: Sequence[str], ninja_log: str, log_age_seconds: float,
                   variant: Mapping[str, object] | None = None,
                   version: str | None = None, units: int | None = None,
                   run_units: tuple[int, int] | None = None, new_run: bool = False) -> BuildProgress:
    """Where a build planned by `plan_build(machine, profile, archs, version=version, units=units,
    variant=variant)` stands, from its ninja log so far, written `log_age_seconds`
    ago (ninja appends a line as each unit ends; several runs share one log, each on its own
    clock). The time left is the plan's less the time spent until MIN_UNITS_FOR_SPEED units are
    done; then, with per-unit costs, the plan's schedule again at the speed measured on them,
    which predicted whole builds within 4% on 16 and 32 cores (docs/benchmarks.md); without,
    the rest of the units at the pace of those done. `run_units`: ninja's last `[k/N]` line;
    `new_run`: a ninja run started after the last unit the log shows (torch rewrote build.ninja)."""
    base = plan_build(machine, profile, tuple(archs), version=version, units=units, variant=variant)
    numbers = numbers_for(profile, version, units)
    costs = numbers.costs
    edges = unit_costs.parse_ninja_log(ninja_log)
    total = len(base.unit_order) if base.unit_order else numbers.profile.translation_units if numbers.units_known else None
    elapsed = max((e.end_ms for e in edges), default=0) / 1000 + max(0.0, log_age_seconds)
    done = len(edges)
    progress = BuildProgress(done, total, elapsed, run=max((e.run for e in edges), default=0) + 1 + (new_run and done > 0),
                             runs=(len(costs.runs) or 1) if costs else None, run_units=None if new_run else run_units)
    if total is None:
        return progress
    planned = replace(progress, remaining_seconds=max(0, int(round(base.expected_wall_seconds - elapsed))))
    if done < MIN_UNITS_FOR_SPEED:
        return planned
    if not costs:
        return replace(progress, remaining_seconds=max(0, int(round(elapsed * (total - done) / done))))
    # The log shows only finished units; the ones still compiling slowed them too. ninja keeps
    # every job slot busy while units wait, so after the i-th unit ends min(jobs, total - i) run.
    t0 = min(e.start_ms for e in edges) / 1000
    ends = sorted(e.end_ms / 1000 - t0 for e in edges)
    load = [(0.0, float(min(base.max_jobs, total)))] + [(t, float(min(base.max_jobs, total - i)))
                                                         for i, t in enumerate(ends, 1)]
    speed = build_node_speed(profile, ninja_log, base.archs, base.nvcc_threads, load, split=dict(base.split_units),
                             version=version)
    if not speed:
        return planned
    expected = plan_build(machine, profile, tuple(archs), node_speed=speed, version=version, units=units,
                          variant=variant).expected_wall_seconds
    return replace(progress, node_speed=speed, remaining_seconds=max(0, int(round(expected - elapsed))))


def minutes(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def slurm_request(plan: BuildPlan) -> SlurmRequest:
    """What to ask a scheduler for: the planned cores, 1.5x the time + 10 min, and memory such
    that planning again inside the job's cgroup keeps the same settings (peak + headroom)."""
    peak = plan.predicted_peak_bytes
    mem_gib = math.ceil(max(peak + 4 * GIB, peak / 0.9) / GIB)
    seconds = int(plan.expected_wall_seconds * 1.5) + 600
    h, rest = divmod(seconds, 3600)
    return SlurmRequest(
        cpus_per_task=plan.max_jobs * plan.nvcc_threads + plan.split_cores,
        mem=f"{mem_gib}G",
        time=f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}",
    )
