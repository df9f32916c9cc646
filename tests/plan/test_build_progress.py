"""A running build's progress from its ninja log so far: units done, this machine's speed, the time
left (plan.build_progress), on logs of builds simulated with the planner's own schedule."""

from __future__ import annotations

import pytest

from extforge import plan, unit_costs
from extforge.machine import GIB, Machine

NODE = Machine(cores=16, memory_bytes=128 * GIB, glibc="2.39", cores_source="t", memory_source="t")


def simulated(speed: float) -> tuple[dict[str, tuple[float, float]], float]:
    """When each unit of the planned full sm_90 build starts and ends on a machine compiling at
    `speed` of the cost data, and the whole build's expected compile + link at that speed."""
    p = plan.plan_build(NODE, "flash-attn", ("90",))
    costs = unit_costs.load("flash-attn")
    assert costs is not None and not p.split_units
    seconds = plan.unit_seconds(plan.load_profiles()["flash-attn"], costs, 1, p.nvcc_threads)
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
    progress = plan.build_progress(NODE, "flash-attn", ["90"], (), log, age)
    assert progress is not None and progress.total == 73
    assert progress.done == sum(1 for _, b in spans.values() if b <= t) >= plan.MIN_UNITS_FOR_SPEED
    assert progress.node_speed == pytest.approx(speed, abs=0.01)
    assert progress.elapsed_seconds == pytest.approx(t, abs=0.01)
    # The nominal plan (speed 1) would be off by the node's speed; at the measured one it is not.
    assert progress.remaining_seconds == pytest.approx(expected - t, abs=0.02 * expected)
    assert progress.describe() == (f"compiling: {progress.done} of 73 units, ~{plan.minutes(progress.remaining_seconds)} "
                                   f"left (this machine: {speed:.2f}x the planner's unit costs)")


def test_too_few_units_give_a_count_and_no_time() -> None:
    spans, _ = simulated(0.8)
    first_two = sorted(b for _, b in spans.values())[1]
    progress = plan.build_progress(NODE, "flash-attn", ["90"], (), *log_until(spans, first_two))
    assert progress is not None and progress.done == 2 and progress.remaining_seconds is None
    assert progress.describe() == "compiling: 2 of 73 units"
    assert plan.build_progress(NODE, "flash-attn", ["90"], (), "# ninja log v7\n", 3.0).describe() == \
        "compiling: 0 of 73 units"


def test_a_finished_compile_is_finishing_and_a_profile_without_unit_costs_has_no_progress() -> None:
    spans, _ = simulated(1.0)
    t = max(b for _, b in spans.values())
    progress = plan.build_progress(NODE, "flash-attn", ["90"], (), *log_until(spans, t + 600))
    assert progress is not None and progress.done == 73 and progress.remaining_seconds == 0
    assert progress.describe().startswith("compiling: 73 of 73 units, finishing (")
    assert plan.build_progress(NODE, "no-costs-recipe", ["90"], (), "# ninja log v7\n", 0.0) is None
