"""A running build's progress from its ninja log so far: units done, this machine's speed, the time
left (plan.build_progress), on logs of builds simulated with the planner's own schedule."""

from __future__ import annotations

import pytest

from extforge.machine import GIB, Machine
from extforge.planning import plan, unit_costs

NODE = Machine(cores=16, memory_bytes=128 * GIB, glibc="2.39", cores_source="t", memory_source="t")


def simulated(speed: float) -> tuple[dict[str, tuple[float, float]], float]:
    """When each unit of the planned full sm_90 build starts and ends on a machine compiling at
    `speed` of the cost data, and the whole build's expected compile + link at that speed."""
    p = plan.plan_build(NODE, "flash-attn", ("90",))
    numbers = plan.numbers_for("flash-attn")
    costs = numbers.costs
    assert costs is not None and not p.shard_units
    seconds = plan.unit_seconds(numbers.profile, costs, 1, p.nvcc_threads)
    schedule = unit_costs.list_schedule([(u, seconds[u] * speed) for u in p.unit_order], p.max_jobs, costs.concurrency)
    return schedule.spans, plan.plan_build(NODE, "flash-attn", ("90",), node_speed=speed).expected_wall_seconds


def log_until(spans: dict[str, tuple[float, float]], t: float) -> tuple[str, float]:
    """The ninja log at `t` seconds after ninja started, and how long ago it was last written."""
    done = {u: se for u, se in spans.items() if se[1] <= t}
    lines = "".join(f"{round(a * 1000)}\t{round(b * 1000)}\t0\tsrc/{u}.o\th\n" for u, (a, b) in done.items())
    return "# ninja log v7\n" + lines, t - max((b for _, b in done.values()), default=0.0)


@pytest.mark.parametrize("speed", [0.62, 1.15])
def test_time_left_is_the_plan_again_at_the_speed_the_units_so_far_show(speed: float) -> None:
    spans, expected = simulated(speed)
    t = 0.35 * max(b for _, b in spans.values())
    log, age = log_until(spans, t)
    progress = plan.build_progress(NODE, "flash-attn", ["90"], log, age)
    assert progress is not None and progress.total == 73
    assert progress.done == sum(1 for _, b in spans.values() if b <= t) >= plan.MIN_UNITS_FOR_SPEED
    assert progress.node_speed == pytest.approx(speed, abs=0.01)
    assert progress.elapsed_seconds == pytest.approx(t, abs=0.01)
    # The nominal plan (speed 1) would be off by the node's speed; at the measured one it is not.
    assert progress.remaining_seconds == pytest.approx(expected - t, abs=0.02 * expected)
    assert progress.describe() == (f"compiling: units {progress.done}/73, ~{plan.minutes(progress.remaining_seconds)} "
                                   f"left (this machine: {speed:.2f}x the planner's unit costs)")


def test_before_the_speed_is_known_the_time_left_is_the_plans() -> None:
    """Until MIN_UNITS_FOR_SPEED units are done, the time left is the plan's less the time spent
    (the old code said no time at all, and nothing for a recipe without unit costs)."""
    spans, _ = simulated(0.8)
    first_two = sorted(b for _, b in spans.values())[1]
    progress = plan.build_progress(NODE, "flash-attn", ["90"], *log_until(spans, first_two))
    planned = plan.plan_build(NODE, "flash-attn", ("90",)).expected_wall_seconds
    assert progress.done == 2 and progress.node_speed is None
    assert progress.remaining_seconds == round(planned - first_two)
    assert progress.describe() == f"compiling: units 2/73, ~{plan.minutes(progress.remaining_seconds)} left"
    assert plan.build_progress(NODE, "flash-attn", ["90"], "# ninja log v7\n", 3.0).describe() == \
        f"compiling: units 0/73, ~{plan.minutes(planned - 3)} left"


def test_a_finished_compile_is_finishing() -> None:
    spans, _ = simulated(1.0)
    t = max(b for _, b in spans.values())
    progress = plan.build_progress(NODE, "flash-attn", ["90"], *log_until(spans, t + 600))
    assert progress.done == 73 and progress.remaining_seconds == 0
    assert progress.describe().startswith("compiling: units 73/73, finishing (")


def pyg_log(runs: list[dict[str, float]], until: float) -> tuple[str, float]:
    """The ninja log of a setuptools build of several extensions (torch-scatter's shape: one ninja
    run per extension, one after another, 1-3 units each, all compiling at once, 5 s of linking
    between two runs) at `until` seconds after the first started, and its age then."""
    lines, start, last = [], 0.0, 0.0
    wall = 1_800_000_000 * 10**9  # the log's mtime column: ninja's wall clock at each edge's start, in ns
    for run in runs:
        for unit, seconds in run.items():
            if start + seconds <= until:
                lines.append(f"0\t{round(seconds * 1000)}\t{wall + round(start * 1e9)}\tcsrc/{unit}.o\t{unit}\n")
                last = max(last, start + seconds)
        start += max(run.values()) + 5
    return "# ninja log v7\n" + "".join(lines), until - last


SCATTER_RUNS = [{"scatter": 57.1, "scatter_cpu": 44.6}, {"segment_coo": 54.5, "segment_coo_cpu": 49.1},
                {"segment_csr": 47.1, "segment_csr_cpu": 40.3}, {"version": 40.4}]


def test_a_build_of_several_ninja_runs_says_which_run_and_the_units_of_the_sdist() -> None:
    """torch-scatter's shape, never built here (the default estimate over the 7 units its sdist's
    setup.py globs): the ninja run it is in, the units done of the count, and a time left from
    the plan, then at the pace of the units done (the old code said nothing for such a recipe)."""
    log, age = pyg_log(SCATTER_RUNS, 70.0)
    # 70 s in: the first run's 2 units are done and the second run started (build.ninja rewritten).
    progress = plan.build_progress(NODE, "torch-scatter", ["90"], log, age, units=7, run_units=(2, 2), new_run=True)
    assert (progress.run, progress.runs, progress.done, progress.total, progress.run_units) == (2, None, 2, 7, None)
    planned = plan.plan_build(NODE, "torch-scatter", ("90",), units=7).expected_wall_seconds
    assert progress.remaining_seconds == round(planned - 70.0)
    assert progress.describe() == f"compiling: ninja run 2, units 2/7, ~{plan.minutes(progress.remaining_seconds)} left"
    later = plan.build_progress(NODE, "torch-scatter", ["90"], *pyg_log(SCATTER_RUNS, 130.0), units=7, new_run=True)
    assert (later.run, later.done) == (3, 4) and later.remaining_seconds == round(130.0 * 3 / 4)
    # Without a count: the units done, and ninja's own count of the run.
    log, age = pyg_log(SCATTER_RUNS, 112.0)
    unknown = plan.build_progress(NODE, "torch-scatter", ["90"], log, age, run_units=(1, 2))
    assert unknown.describe() == "compiling: ninja run 2, 3 units done (1/2 of this run)"


def test_a_learned_pyg_build_says_its_run_of_the_runs_learned(tmp_path) -> None:
    """The second build of a recipe learned from a build of 4 ninja runs: `ninja run 3 of 4` (the
    plan is of one ninja run, as the build layer compiles setuptools' extensions: a build still
    run one extension after another, EXTFORGE_NINJA=separate, ends later than its plan)."""
    from extforge.planning import cost_store

    first, _ = pyg_log(SCATTER_RUNS, 1000.0)
    cost_store.save(cost_store.measure("torch-scatter", "2.1.2", first, ("90",), 1, None))
    log, age = pyg_log([{u: s * 1.1 for u, s in run.items()} for run in SCATTER_RUNS], 140.0)
    progress = plan.build_progress(NODE, "torch-scatter", ["90"], log, age, version="2.1.2", new_run=True)
    assert (progress.run, progress.runs, progress.done, progress.total) == (3, 4, 4, 7)
    assert progress.node_speed == pytest.approx(1.1, abs=0.01) and progress.remaining_seconds is not None
    assert progress.describe().startswith("compiling: ninja run 3 of 4, units 4/7, ")
