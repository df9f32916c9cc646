"""Units compiled as parallel parts: what the planner splits, how a split build is learned back,
and the costs a recipe folder ships. The layer's side (real nvcc, parts joined into one object) is
tests/build/test_build_layer.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.plan.test_cost_store import ninja_log

from extforge.machine import GIB, Machine
from extforge.planning import cost_store, plan, unit_costs

RECIPES = Path(__file__).resolve().parents[2] / "recipe"
# causal-conv1d 1.7.0 for sm_90 on an H100 node, 4 jobs (run V): one unit is the build.
RUN_V = {"causal_conv1d": 38.6, "causal_conv1d_bwd": 355.1, "causal_conv1d_fwd": 20.5, "causal_conv1d_update": 7.4}
LIMITS = {"causal_conv1d_bwd": 18, "causal_conv1d_fwd": 18, "causal_conv1d_update": 9}


def node(cores: int, gib: float) -> Machine:
    return Machine(cores=cores, memory_bytes=int(gib * GIB), glibc="2.36", cores_source="test", memory_source="test")


def test_the_unit_the_build_waits_for_is_split_over_the_spare_cores() -> None:
    one_wave = unit_costs.runs_makespan(RUN_V, 4)
    split = unit_costs.split_in_parts(RUN_V, jobs=4, cores=16, limits=LIMITS)
    assert one_wave == 355.1 and list(split.parts) == ["causal_conv1d_bwd"]
    k = split.parts["causal_conv1d_bwd"]
    # Up to a core each beside the 4 jobs; every part its share plus the front end it repeats.
    assert 2 <= k <= 13 and split.processes == 4 + k - 1
    assert split.costs[unit_costs.part_name("causal_conv1d_bwd", k)] == pytest.approx(355.1 * (1 / k + unit_costs.PART_REPEAT))
    assert "causal_conv1d_bwd" not in split.costs
    assert unit_costs.runs_makespan(split.costs, split.processes) < one_wave / 4
    # Two cores and two jobs: no core to spare, still two parts (the other core idles otherwise),
    # never more.
    small = unit_costs.split_in_parts(RUN_V, jobs=2, cores=2, limits=LIMITS)
    assert small.parts == {"causal_conv1d_bwd": 2} and small.processes == 3
    assert unit_costs.runs_makespan(small.costs, 3) < unit_costs.runs_makespan(RUN_V, 2) * 0.6


def test_a_unit_no_build_counted_instantiations_of_or_no_memory_for_is_not_split() -> None:
    assert unit_costs.split_in_parts(RUN_V, jobs=4, cores=16, limits={}).parts == {}
    assert unit_costs.split_in_parts(RUN_V, jobs=4, cores=16, limits={"causal_conv1d_bwd": 1}).parts == {}
    assert unit_costs.split_in_parts(RUN_V, jobs=4, cores=16, limits=LIMITS, memory_room=0).parts == {}
    assert unit_costs.split_in_parts(RUN_V, jobs=4, cores=16, limits=LIMITS, memory_room=2).parts == {"causal_conv1d_bwd": 3}
    # Instantiations cap the parts; units that are not the build's long pole stay whole.
    assert unit_costs.split_in_parts(RUN_V, jobs=4, cores=64, limits=LIMITS | {"causal_conv1d_bwd": 5}).parts == {
        "causal_conv1d_bwd": 5}
    even = dict.fromkeys(("a", "b", "c", "d"), 100.0)
    assert unit_costs.split_in_parts(even, jobs=4, cores=4, limits=dict.fromkeys(even, 8)).parts == {}


def test_a_split_build_is_learned_as_its_whole_unit_and_planned_again(tmp_path: Path, own_cost_store: Path) -> None:
    # A 2-core build that split the backward unit in two: ninja saw the longer part only.
    seen = RUN_V | {"causal_conv1d_bwd": 340.0}
    split_log = "\n".join(json.dumps(d) for d in [
        {"unit": "causal_conv1d_bwd", "instantiations": 18}, {"unit": "causal_conv1d_fwd", "instantiations": 18},
        {"unit": "causal_conv1d_update", "instantiations": 9}, {"unit": "unused_kernel", "instantiations": 4},
        {"unit": "causal_conv1d_bwd", "parts": 2, "instantiations": 18, "seconds": [300.0, 340.0]}]) + "\n"
    log = tmp_path / ".ninja_log"
    log.write_text(ninja_log(seen, 2))
    (tmp_path / "split.log").write_text(split_log)
    entry = cost_store.learn_from_build("causal-conv1d", "1.7.0", log, ("90",), {"NVCC_THREADS": "1"}, tmp_path / "split.log")
    assert entry is not None
    whole = round(640.0 / (1 + 2 * unit_costs.PART_REPEAT), 1)
    assert entry.units["causal_conv1d_bwd"] == whole and entry.units["causal_conv1d"] == 38.6
    # Only units the build compiled, and only those that can be split, are remembered as such.
    assert json.loads(entry.path.read_text())["part_limits"] == LIMITS
    again = plan.plan_build(node(2, 23), "causal-conv1d", ("90",), version="1.7.0")
    assert again.env()["EXTFORGE_SPLIT_UNITS"] == "causal_conv1d_bwd=2" and again.split_units == (("causal_conv1d_bwd", 2),)
    # Planned again in two parts, each is the parts' mean: what the first build measured.
    assert unit_costs.split_in_parts(entry.costs().seconds(), 2, 2, (), LIMITS).costs[
        unit_costs.part_name("causal_conv1d_bwd", 1)] == pytest.approx(320.0, abs=0.1)
    assert any("compiled as parallel parts" in r and "causal_conv1d_bwd in 2" in r for r in again.reasons)
    # A unit the layer had to compile whole (a part would define a symbol twice) is not split again.
    (tmp_path / "split.log").write_text(
        json.dumps({"unit": "causal_conv1d_bwd", "instantiations": 18}) + "\n"
        + json.dumps({"unit": "causal_conv1d_bwd", "parts": 1, "instantiations": 18, "seconds": [700.0],
                      "compiled_whole": "1 symbol(s) defined in more than one part, e.g. _Z3fooi"}) + "\n")
    log.write_text(ninja_log(RUN_V | {"causal_conv1d_bwd": 700.0}, 2))
    assert cost_store.learn_from_build("causal-conv1d", "1.7.0", log, ("90",), {"NVCC_THREADS": "1"},
                                       tmp_path / "split.log") is not None
    assert plan.plan_build(node(2, 23), "causal-conv1d", ("90",), version="1.7.0").split_units == ()


def test_a_recipe_folder_ships_costs_for_a_sites_first_build(tmp_path: Path, own_cost_store: Path) -> None:
    folder = tmp_path / "causal-conv1d"
    shutil.copytree(RECIPES / "causal-conv1d", folder)
    assert plan.plan_build(node(16, 128), "causal-conv1d", ("90",), version="1.7.0").numbers_from.startswith("default")
    with cost_store.recipe_costs(folder):
        first = plan.plan_build(node(16, 128), "causal-conv1d", ("90",), version="1.7.0")
    assert first.numbers_from.endswith("largest compiler process 3.2 GiB") and str(folder) in first.numbers_from
    assert dict(first.split_units).get("causal_conv1d_bwd", 0) > 2 and first.expected_wall_seconds < 120
    # The site's own measurement, once made, wins over what the recipe ships.
    log = tmp_path / ".ninja_log"
    log.write_text(ninja_log(RUN_V, 4))
    assert cost_store.learn_from_build("causal-conv1d", "1.7.0", log, ("90",), {"NVCC_THREADS": "1"}) is not None
    with cost_store.recipe_costs(folder):
        assert str(own_cost_store) in plan.plan_build(node(16, 128), "causal-conv1d", ("90",), version="1.7.0").numbers_from
    # A broken shipped file is a warning and the default estimate, never a failed plan.
    (folder / cost_store.RECIPE_FILE).write_text("{")
    with cost_store.recipe_costs(folder):
        assert cost_store.load("causal-conv1d", "1.7.0", tmp_path / "empty-store") is None
