"""extforge.planning.unit_costs: ninja logs, the LPT schedule, the per-unit data the planner reads."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.machine import GIB, Machine
from extforge.planning import cost_store, unit_costs
from extforge.planning.plan import numbers_for, plan_build, unit_seconds
from extforge.planning.unit_costs import list_schedule, longest_first, lpt_makespan, parse_ninja_log


def brute_force_makespan(costs: list[float], jobs: int) -> float:
    best = float("inf")
    for assignment in itertools.product(range(jobs), repeat=len(costs)):
        loads = [0.0] * jobs
        for c, j in zip(costs, assignment):
            loads[j] += c
        best = min(best, max(loads))
    return best


def test_list_schedule_starts_each_unit_on_the_first_free_slot() -> None:
    # Slot 0: a (5) then d (1); slot 1: b (3) then c (2), free at 5; d goes where a ended (5).
    s = list_schedule([("a", 5), ("b", 3), ("c", 2), ("d", 1)], 2)
    assert s.makespan == 6
    assert sorted(map(tuple, s.slots)) == [("a", "d"), ("b", "c")]


def test_upstream_order_leaves_the_long_unit_for_last() -> None:
    costs = {f"short{i}": 10.0 for i in range(6)} | {"long": 30.0}
    upstream = list_schedule(list(costs.items()), 3).makespan  # long starts at 20
    assert upstream == 50
    assert lpt_makespan(costs, 3) == 30  # long first, the shorts fill the other slots


@pytest.mark.parametrize("costs,jobs", [
    ([7, 5, 4, 3, 3, 2, 2, 1], 3),
    ([9, 8, 2, 2, 2, 2, 2, 2, 1], 2),
    ([5, 5, 4, 4, 3, 3, 3], 3),  # the classic case where LPT is not optimal (11 vs 9)
])
def test_lpt_is_within_4_3_of_the_optimum(costs: list[float], jobs: int) -> None:
    named = {f"u{i}": c for i, c in enumerate(costs)}
    optimum = brute_force_makespan(costs, jobs)
    lpt = lpt_makespan(named, jobs)
    assert optimum <= lpt <= (4 / 3 - 1 / (3 * jobs)) * optimum + 1e-9
    assert lpt >= max(costs) and lpt >= sum(costs) / jobs


def test_more_jobs_than_units_is_the_longest_unit() -> None:
    assert lpt_makespan({"a": 4.0, "b": 9.0}, 16) == 9.0
    with pytest.raises(ValueError):
        list_schedule([("a", 1.0)], 0)


def test_longest_first_order_is_reproducible() -> None:
    assert longest_first({"b": 2.0, "a": 2.0, "c": 3.0}) == ["c", "a", "b"]


# v5: the mtime is the output's, as its edge ended; the last line is an incremental rebuild 15 min later
# (the same command: its hash).
NINJA_LOG = """# ninja log v5
0\t41250\t1732350041250000000\t/b/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/flash_api.o\t8f0c6a2b3c4d5e6f
12\t398012\t1732350398012000000\t/b/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/flash_bwd_hdim256_bf16_causal_sm80.o\t1a2b3c4d5e6f7a8b
15\t101500\t1732350101500000000\t/b/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.o\t2a2b3c4d5e6f7a8b
garbage line
101600\t190000\t1732350190000000000\t/b/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/flash_fwd_split_hdim64_bf16_sm80.o\t3a2b3c4d5e6f7a8b
20\t500\t1732350900500000000\t/b/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.o\t2a2b3c4d5e6f7a8b
"""


def test_ninja_log_keeps_the_last_entry_of_each_output() -> None:
    edges = parse_ninja_log(NINJA_LOG)
    by_unit = {e.unit: e.seconds for e in edges}
    assert by_unit == {
        "flash_api": 41.25,
        "flash_bwd_hdim256_bf16_causal_sm80": 398.0,
        "flash_fwd_hdim32_fp16_sm80": 0.48,  # the later (incremental) entry wins
        "flash_fwd_split_hdim64_bf16_sm80": 88.4,
    }
    assert [e.unit for e in edges][0] == "flash_api"  # ordered by start


def test_not_a_ninja_log_is_refused() -> None:
    with pytest.raises(ExtforgeError, match="not a ninja log"):
        parse_ninja_log("0\t1\t2\tx.o\th\n")


def test_a_learned_entry_round_trips_into_the_planner(tmp_path: Path) -> None:
    seconds = unit_costs.unit_seconds(parse_ninja_log(NINJA_LOG))
    entry = cost_store.measure("some-recipe", "1.0", NINJA_LOG, ["90"], 1, None)
    cost_store.save(entry, tmp_path)
    costs = cost_store.load("some-recipe", store=tmp_path)
    assert costs is not None and costs.costs().any_measured and costs.archs == ("90",)
    assert costs.costs().seconds() == pytest.approx(seconds)


def test_unmeasured_units_are_planned_at_the_mean_of_the_measured() -> None:
    """The old code weighed an unmeasured unit by flash-attn's kinds and head dims, whatever the recipe."""
    costs = unit_costs.UnitCosts("x", {"a": 100.0, "b": 300.0, "c": None}, ("90",))
    assert costs.seconds() == {"a": 100.0, "b": 300.0, "c": 200.0}
    assert unit_costs.UnitCosts("x", {"a": None, "b": None}).seconds() == {"a": 1.0, "b": 1.0}


def run_j_node_speed(costs: unit_costs.UnitCosts) -> float:
    assert costs.concurrency is not None
    log = Path(__file__).resolve().parents[2] / "bench" / "data" / "2026-11-23-h100-16cores-flash-attn-hd128.ninja_log"
    return unit_costs.node_speed(parse_ninja_log(log.read_text()), costs.seconds(), costs.concurrency)[0]


def test_shipped_flash_attn_data_measures_every_unit() -> None:
    numbers = numbers_for("flash-attn")
    costs, profile = numbers.costs, numbers.profile
    assert costs is not None and len(costs.units) == profile.translation_units == 73
    assert all(s is not None and s > 0 for s in costs.units.values())
    assert costs.concurrency is not None and costs.concurrency.reference == 16
    per_unit = unit_seconds(profile, costs, 1, 1)
    # Run G took 1407 s (16 jobs, compile + link; setuptools' name order) on a 16-core node; the
    # costs come from a 32-core node's build, paced at 16 compiles at once. Nodes differ in speed:
    # at the speed of run J's node (16 cores, the same day; its log in bench/data) it is within 5%.
    speed = run_j_node_speed(costs)
    upstream = list_schedule(sorted((u, s * speed) for u, s in per_unit.items()), 16, costs.concurrency).makespan
    assert upstream + profile.link_seconds == pytest.approx(1407, rel=0.05)
    assert lpt_makespan(per_unit, 16, costs.concurrency) + profile.link_seconds < upstream
    slim = unit_costs.in_variant(per_unit, costs.subsets, {"flash_attn_head_dims": ["128"]})
    assert len(slim) == 13 and "flash_api" in slim


def test_a_full_build_starts_the_split_kv_units_first() -> None:
    """On the node's data the split-kv forward units are the longest (400-518 s at 32 compiles
    at once): a full build starts them first, backward next, forward last, flash_api at the end."""
    node = Machine(cores=32, memory_bytes=251 * GIB, glibc="2.39", cores_source="t", memory_source="t")
    order = list(plan_build(node, "flash-attn", ("90",)).unit_order)
    assert len(order) == 73 and order[-1] == "flash_api"
    assert all(u.startswith("flash_fwd_split_") for u in order[:10])
    # Every non-causal split-kv unit starts in the first wave of 32 compiles.
    assert {u for u in order if u.startswith("flash_fwd_split_") and "_causal" not in u} <= set(order[:16])

    def mean_rank(kind: str) -> float:
        ranks = [i for i, u in enumerate(order) if u.startswith(f"flash_{kind}_hdim")]
        return sum(ranks) / len(ranks)

    assert mean_rank("fwd_split") < mean_rank("bwd") < mean_rank("fwd")


def test_head_dim_subset_plan_is_shorter() -> None:
    node = Machine(cores=16, memory_bytes=128 * GIB, glibc="2.36", cores_source="t", memory_source="t")
    full = plan_build(node, "flash-attn", ("90",))
    slim = plan_build(node, "flash-attn", ("90",), variant={"flash_attn_head_dims": ["128"]})
    assert slim.expected_wall_seconds < 0.5 * full.expected_wall_seconds
    assert full.upstream_order_wall_seconds is not None and full.upstream_order_wall_seconds > full.expected_wall_seconds


SHARDS = unit_costs.ShardModel({"fwd": unit_costs.ShardKind("flash_fwd_hdim", 0.2, 0.4),
                                 "bwd": unit_costs.ShardKind("flash_bwd_hdim", 0.2, 0.5),
                                 "fwd_split": unit_costs.ShardKind("flash_fwd_split_hdim", 0.2, 0.5)})


def test_a_unit_longer_than_the_rest_of_the_schedule_is_split() -> None:
    # 4 slots, one 400 s split-kv unit and three 100 s ones: alone, the long unit is the wall time.
    long = "flash_fwd_split_hdim128_fp16_sm80"
    costs = {long: 400.0, **{f"flash_fwd_hdim{d}_fp16_sm80": 100.0 for d in (32, 64, 96)}}
    split_costs, split = unit_costs.shard_units(costs, 4, SHARDS)
    assert split == [long]
    # Each half repeats 20% of the unit and takes half of the rest.
    assert split_costs[long] == pytest.approx(240.0)
    assert split_costs[long + unit_costs.SHARD_SUFFIX] == pytest.approx(240.0)
    assert lpt_makespan(split_costs, 4) == pytest.approx(240.0)
    # What a build that split it measured folds back into the unit's own seconds.
    assert unit_costs.joined(split_costs, SHARDS) == pytest.approx(costs)


def test_busy_slots_split_nothing() -> None:
    costs = {f"flash_bwd_hdim{d}_{t}_sm80": 300.0 for d in (32, 64, 96, 128) for t in ("fp16", "bf16")}
    assert unit_costs.shard_units(costs, 2, SHARDS) == (costs, [])


def test_only_kernel_units_of_a_known_switch_are_split() -> None:
    costs = {"flash_api": 500.0, "flash_fwd_hdim64_fp16_sm80": 100.0}
    assert unit_costs.shard_units(costs, 4, SHARDS)[1] == []
    no_split_kv = unit_costs.ShardModel({"fwd": unit_costs.ShardKind("flash_fwd_hdim", 0.2, 0.4)})
    assert unit_costs.shard_units({"flash_fwd_split_hdim64_fp16_sm80": 500.0}, 4, no_split_kv)[1] == []
    assert unit_costs.shard_units({"flash_fwd_hdim64_fp16_sm80": 500.0}, 4, None)[1] == []


def test_shipped_data_splits_the_head_dim_128_build_only() -> None:
    node = Machine(cores=16, memory_bytes=128 * GIB, glibc="2.36", cores_source="t", memory_source="t")
    full = plan_build(node, "flash-attn", ("90",))
    slim = plan_build(node, "flash-attn", ("90",), variant={"flash_attn_head_dims": ["128"]})
    assert full.shard_units == () and "EXTFORGE_SHARD_UNITS" not in full.env()
    assert slim.shard_units and slim.shard_units[0] == "flash_fwd_split_hdim128_fp16_sm80"
    assert slim.env()["EXTFORGE_SHARD_UNITS"].split(";") == list(slim.shard_units)
    order = slim.env()["EXTFORGE_UNIT_ORDER"].split(";")
    assert all(u + unit_costs.SHARD_SUFFIX in order for u in slim.shard_units)
    assert slim.upstream_order_wall_seconds is not None and slim.expected_wall_seconds < slim.upstream_order_wall_seconds
