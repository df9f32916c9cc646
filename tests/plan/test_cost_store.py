"""The planner learns any recipe: a conservative estimate before its first build, then the
per-unit costs its ninja log showed, from a site-writable store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge.building.build import build_environment
from extforge.cli import main
from extforge.errors import ExtforgeError
from extforge.machine import GIB, Machine
from extforge.planning import cost_store, plan, unit_costs
from extforge.planning.unit_costs import lpt_makespan, parse_ninja_log

# causal-conv1d 1.7.0's four units as a 2-job build on 2 cores ran them (setuptools' name order).
BENCH = Path(__file__).resolve().parents[2] / "bench"
UNITS = {"causal_conv1d": 60.0, "causal_conv1d_bwd": 240.0, "causal_conv1d_fwd": 95.0, "causal_conv1d_update": 410.0}


def node(cores: int, gib: float) -> Machine:
    return Machine(cores=cores, memory_bytes=int(gib * GIB), glibc="2.36", cores_source="test", memory_source="test")


def ninja_log(units: dict[str, float], jobs: int, version: int = 5, runs: int = 1) -> str:
    """A .ninja_log as ninja writes it, the units started in the given order on `jobs` slots;
    with `runs`, the units split into that many ninja runs one after another."""
    names = list(units)
    size = -(-len(names) // runs)
    return ninja_log_of_runs([{u: units[u] for u in names[i:i + size]} for i in range(0, len(names), size)], jobs, version)


def ninja_log_of_runs(runs: list[dict[str, float]], jobs: int, version: int = 7) -> str:
    """A .ninja_log as ninja writes it (start and end in ms since that ninja run started, a wall
    clock in ns: v5 the output's mtime as the edge ended, v6 on as it started; output, command
    hash): each run's units started in the given order on `jobs` slots, the runs one after
    another (setuptools runs one per extension), each appended with its own clock. A unit in
    two runs is one object path compiled by two commands (two extensions' flags)."""
    lines = [f"# ninja log v{version}"]
    wall_ms = 1_764_230_400_000
    for units in runs:
        free = [0.0] * jobs
        for unit, seconds in units.items():
            slot = free.index(min(free))
            start, free[slot] = free[slot], free[slot] + seconds
            stamp = wall_ms + int((start if version >= 6 else free[slot]) * 1000)
            lines.append(f"{int(start * 1000)}\t{int(free[slot] * 1000)}\t{stamp * 10**6 + 417}\t"
                         f"/home/builder/src/build/temp.linux-x86_64-cpython-312/csrc/{unit}.o\t{len(lines):016x}")
        wall_ms += int(max(free) * 1000) + 7_500  # the extension's link before the next run starts
    return "\n".join(lines) + "\n"


def learn(tmp_path: Path, units: dict[str, float] = UNITS, jobs: int = 2, version: str = "1.7.0",
          threads: str = "1", peak: int | None = 2 * GIB, runs: int = 1, recipe: str = "causal-conv1d",
          log_version: int = 5) -> cost_store.Learned | None:
    log = tmp_path / f"work-{len(list(tmp_path.glob('work-*')))}" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text(ninja_log(units, jobs, log_version, runs))
    env = {"MAX_JOBS": str(jobs), "NVCC_THREADS": threads}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cost_store, "largest_child_process_bytes", lambda _env: peak)
        return cost_store.learn_from_build(recipe, version, log, ("90",), env)


def test_a_recipe_never_measured_is_planned_so_it_cannot_oom() -> None:
    flash = plan.default_profile("causal-conv1d")
    for cores, gib in [(2, 23), (16, 64), (64, 128), (128, 32)]:
        p = plan.plan_build(node(cores, gib), "causal-conv1d", ("90",))
        assert p.numbers_from.startswith("default estimate")
        assert p.max_jobs >= 1 and p.max_jobs * flash.per_job_peak_gib * GIB <= p.memory_limit_bytes
        assert p.max_jobs * p.nvcc_threads <= cores
    # With its unit count known, no more jobs than units.
    few = plan.plan_build(node(64, 512), "causal-conv1d", ("90",), units=4)
    assert few.max_jobs == 4 and any("the recipe's 4 units, not cores" in r for r in few.reasons)
    small = plan.plan_build(node(64, 32), "causal-conv1d", ("90",))
    assert any("memory, not cores" in r for r in small.reasons)


def test_every_recipe_build_gets_job_settings() -> None:
    env = build_environment("context: {name: causal-conv1d, version: '1.7.0'}\n", [], {"cuda_archs": ["9.0"]},
                            "causal-conv1d")
    assert int(env["MAX_JOBS"]) >= 1 and int(env["NVCC_THREADS"]) >= 1
    assert "EXTFORGE_UNIT_ORDER" not in env  # nothing measured yet to order by


def test_the_first_build_teaches_the_second(tmp_path: Path, own_cost_store: Path) -> None:
    entry = learn(tmp_path)
    assert entry is not None and entry.path == own_cost_store / "causal-conv1d" / "1.7.0.json"
    stored = json.loads(entry.path.read_text())
    assert stored["units"] == UNITS and stored["jobs"] == 2 and stored["archs"] == ["90"]
    assert stored["compile_seconds"] == 565.0 and stored["largest_process_bytes"] == 2 * GIB
    assert [p.name for p in entry.path.parent.iterdir()] == ["1.7.0.json"]  # no temporary left

    second = plan.plan_build(node(2, 23), "causal-conv1d", ("90",), version="1.7.0")
    assert second.numbers_from.startswith(f"learned on {entry.date} from 4 units")
    assert second.unit_order == ("causal_conv1d_update", "causal_conv1d_bwd", "causal_conv1d_fwd", "causal_conv1d")
    assert second.env()["EXTFORGE_UNIT_ORDER"].split(";")[0] == "causal_conv1d_update"
    assert (second.max_jobs, second.nvcc_threads) == (2, 1)
    assert second.expected_wall_seconds == round(lpt_makespan(UNITS, 2)) == 410
    # Setuptools' name order, as the first build ran it: the log's own span.
    assert second.upstream_order_wall_seconds == 565
    # Memory from the measured process (2 GiB x 1.25 margin), not flash-attn's 4.4 GiB.
    wide = plan.plan_build(node(64, 24), "causal-conv1d", ("90",))
    assert wide.max_jobs == 4 and wide.predicted_peak_bytes == 4 * int(2.5 * GIB)
    assert plan.plan_build(node(64, 24), "never-built", ("90",)).max_jobs == 4  # 20 GiB / 4.4 GiB
    # Two archs: more seconds per unit.
    assert plan.plan_build(node(2, 23), "causal-conv1d", ("80", "90")).expected_wall_seconds > 410


# torch-scatter 2.1.2's units (run Z3's seconds): setuptools builds its four extensions one after
# another, each through a ninja run of its own that appends to the one .ninja_log.
SCATTER = {"scatter": 57.1, "scatter_cpu": 44.6, "scatter_cuda": 72.0, "segment_coo": 54.5, "segment_coo_cpu": 49.1,
           "segment_coo_cuda": 122.5, "segment_csr": 47.1, "segment_csr_cpu": 40.3, "segment_csr_cuda": 72.0,
           "version": 40.4}


def test_a_build_of_several_ninja_runs_is_learned_run_by_run_and_planned_as_one(tmp_path: Path,
                                                                                 own_cost_store: Path) -> None:
    """The build layer compiles setuptools' extensions in one ninja run: the next build is planned
    with every unit sharing the job slots (the old planner added the runs up, 3 jobs on 16 cores),
    and upstream's one run after another is what a plain build does."""
    entry = learn(tmp_path, SCATTER, jobs=16, runs=4, recipe="torch-scatter", version="2.1.2", log_version=7)
    assert entry is not None
    assert entry.runs == (("scatter", "scatter_cpu", "scatter_cuda"), ("segment_coo", "segment_coo_cpu", "segment_coo_cuda"),
                          ("segment_csr", "segment_csr_cpu", "segment_csr_cuda"), ("version",))
    # Three units at once at most, and compiling only (the links between the runs left out).
    assert entry.jobs == 3 and entry.compile_seconds == 72.0 + 122.5 + 72.0 + 40.4
    assert json.loads(entry.path.read_text())["runs"][3] == ["version"]

    second = plan.plan_build(node(16, 64), "torch-scatter", ("90",), version="2.1.2")
    assert second.max_jobs == 10  # every unit at once: as many job slots as units, memory allowing
    assert second.expected_wall_seconds == round(lpt_makespan(SCATTER, 10)) == 122
    assert second.upstream_order_wall_seconds == round(72.0 + 122.5 + 72.0 + 40.4)
    assert any("4 extensions compile in one ninja run" in r for r in second.reasons)


def test_an_object_compiled_again_by_another_extension_is_another_compile(tmp_path: Path, own_cost_store: Path) -> None:
    """torch-scatter's setup.py (FORCE_CUDA=1) builds each op twice: a CUDA extension of its three
    sources, then a CPU one of two of them, with other flags, to the same object paths. Both
    compiles ran; the second of each is its own unit."""
    runs = [{"segment_coo": 42.6, "segment_coo_cpu": 38.0, "segment_coo_cuda": 110.6},
            {"segment_coo": 30.1, "segment_coo_cpu": 28.0},
            {"version": 38.0}, {"version": 20.0}]
    log = tmp_path / "work" / ".ninja_log"
    log.parent.mkdir()
    log.write_text(ninja_log_of_runs(runs, 16))
    entry = cost_store.learn_from_build("torch-scatter", "2.1.2", log, ("90",), {"NVCC_THREADS": "1"})
    assert entry is not None
    assert entry.runs == (("segment_coo", "segment_coo_cpu", "segment_coo_cuda"), ("segment_coo@2", "segment_coo_cpu@2"),
                          ("version",), ("version@2",))
    assert entry.units["segment_coo@2"] == 30.1 and entry.units["version@2"] == 20.0
    assert entry.compile_seconds == 110.6 + 30.1 + 38.0 + 20.0
    planned = plan.plan_build(node(16, 64), "torch-scatter", ("90",), version="2.1.2")
    assert planned.max_jobs == 7 and planned.expected_wall_seconds == round(110.6)
    assert planned.upstream_order_wall_seconds == round(110.6 + 30.1 + 38.0 + 20.0)
    # On two cores, upstream's order is the order the measured build started each run's units:
    # there the .cu waits for the first of the two .cpp to end.
    two = plan.plan_build(node(2, 23), "torch-scatter", ("90",), version="2.1.2")
    assert two.expected_wall_seconds == round(lpt_makespan(entry.units, 2))
    assert two.upstream_order_wall_seconds == round(38.0 + 110.6 + 30.1 + 38.0 + 20.0)


def test_logs_of_one_ninja_run_stay_one_run() -> None:
    """Every node log the shipped data was fitted on is one ninja run (ninja 1.12's v7 logs the wall
    clock at each edge's start), and an older ninja's log (v5: the output's mtime, in seconds
    before ninja 1.10, as each edge ended) too."""
    for path in sorted((BENCH / "data").glob("*.ninja_log")):
        assert {e.run for e in parse_ninja_log(path.read_text())} == {0}, path.name
    old = ["# ninja log v5"] + [f"{a}\t{b}\t{1_764_230_400 + b // 1000}\tcsrc/{u}.o\t{i:016x}"
                                for i, (u, a, b) in enumerate([("a", 0, 60_000), ("b", 0, 240_000), ("c", 60_000, 155_000)])]
    assert {e.run for e in parse_ninja_log("\n".join(old))} == {0}


def test_a_compile_cache_rebuild_does_not_replace_real_costs(tmp_path: Path) -> None:
    first = learn(tmp_path, peak=3 * GIB)
    warm = learn(tmp_path, {u: 1.5 for u in UNITS}, peak=GIB)
    assert first is not None and warm == first
    # A real rebuild (slower machine) replaces it, keeping the larger process peak seen.
    slower = learn(tmp_path, {u: s * 1.3 for u, s in UNITS.items()}, peak=GIB)
    assert slower is not None and slower.units["causal_conv1d_bwd"] == 312.0 and slower.largest_process_bytes == 3 * GIB


def test_a_store_beside_the_channel_and_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "nfs" / "extforge" / "unit-costs"
    monkeypatch.setenv(cost_store.STORE_ENV, str(shared))
    learn(tmp_path, version="1.6.0")
    learn(tmp_path, {u: s * 2 for u, s in UNITS.items()}, version="1.7.0")
    assert sorted(p.name for p in (shared / "causal-conv1d").iterdir()) == ["1.6.0.json", "1.7.0.json"]
    exact = plan.plan_build(node(2, 23), "causal-conv1d", ("90",), version="1.6.0")
    assert exact.expected_wall_seconds == round(lpt_makespan(UNITS, 2))
    other = plan.plan_build(node(2, 23), "causal-conv1d", ("90",), version="1.8.0")
    assert "of version 1.7.0" in other.numbers_from  # the newest measured stands in


def test_a_sites_subset_build_is_planned_with_what_the_recipe_ships(tmp_path: Path) -> None:
    """flash-attn's numbers were the product's and always won: a site's own builds never counted.
    Now the site's entry wins, keeping the recipe's units it did not build (at the mean of the
    measured) and what the recipe's data says of them (its head-dim subsets, its split)."""
    log = tmp_path / ".ninja_log"
    hd128 = {"flash_api": 30.0, "flash_fwd_hdim128_fp16_sm80": 100.0, "flash_fwd_split_hdim128_fp16_sm80": 300.0}
    log.write_text(ninja_log(hd128, 3))
    assert cost_store.learn_from_build("flash-attn", "2.8.3", log, ("90",), {}) is not None
    full = plan.plan_build(node(16, 128), "flash-attn", ("90",), version="2.8.3")
    assert full.numbers_from.startswith("learned on") and len(full.unit_order) == 73
    assert full.unit_order[0] == "flash_fwd_split_hdim128_fp16_sm80"
    subset = plan.plan_build(node(16, 128), "flash-attn", ("90",), version="2.8.3",
                             variant={"flash_attn_head_dims": ["128"]})
    assert len(subset.unit_order) == 13 + len(subset.shard_units) and subset.shard_units


def test_costs_follow_the_package_name_not_the_folder(tmp_path: Path, own_cost_store: Path) -> None:
    """The store was keyed by the recipe folder's name: a folder renamed lost its learned costs.
    Entries of the old key (a folder named like the package) are still read."""
    folder = tmp_path / "my-renamed-folder"
    folder.mkdir()
    (folder / "recipe.yaml").write_text("context:\n  name: causal-conv1d\n  version: '1.7.0'\n")
    assert cost_store.recipe_name((folder / "recipe.yaml").read_text()) == "causal-conv1d"
    learn(tmp_path)
    with cost_store.recipe_costs(folder):
        assert plan.plan_build(node(2, 23), "causal-conv1d", ("90",)).numbers_from.startswith("learned on")
    old = tmp_path / "old-name"
    old.mkdir()
    (old / "recipe.yaml").write_text("context:\n  name: renamed-package\n  version: '1.7.0'\n")
    (own_cost_store / "old-name").mkdir()
    (own_cost_store / "causal-conv1d" / "1.7.0.json").rename(own_cost_store / "old-name" / "1.7.0.json")
    with cost_store.recipe_costs(old):
        assert cost_store.load("renamed-package", "1.7.0") is not None


def test_an_unwritable_store_or_a_bad_log_never_fails_the_build(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cost_store.STORE_ENV, str(blocker / "store"))
    assert learn(tmp_path) is None
    bad = tmp_path / "bad.ninja_log"
    bad.write_text("not a log\n")
    assert cost_store.learn_from_build("x", "1", bad, ("90",), {}) is None
    assert cost_store.learn_from_build("x", "1", None, ("90",), {}) is None
    with pytest.raises(ExtforgeError, match="under the recipe"):
        cost_store.entry_path("../etc", "1")


def test_the_peak_is_the_largest_finished_descendant() -> None:
    # A grandchild (as nvcc's cicc is under the build script) that touches 300 MiB.
    subprocess.run(["sh", "-c", f"{sys.executable} -c 'b = b\"x\" * (300 * 2**20)'"], check=True)
    assert (cost_store.largest_child_process_bytes({}) or 0) >= 300 * 2**20
    # sccache compiles in its server, no descendant of ours: nothing honest to record.
    assert cost_store.largest_child_process_bytes({"SCCACHE_DIR": "/x"}) is None


def test_plan_command_says_where_the_numbers_come_from(tmp_path: Path, capsys) -> None:
    args = ["plan", "--profile", "causal-conv1d", "--archs", "90", "--cores", "2", "--memory", "23G"]
    assert main(args) == 0
    assert "numbers: default estimate" in capsys.readouterr().err
    entry = learn(tmp_path)
    assert entry is not None
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["numbers_from"] == plan.plan_build(node(2, 23), "causal-conv1d", ("90",)).numbers_from
    assert out["env"]["EXTFORGE_UNIT_ORDER"].startswith("causal_conv1d_update;")
    assert main(args) == 0
    assert f"numbers: learned on {entry.date} from 4 units" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not installed")
def test_a_real_ninja_log(tmp_path: Path) -> None:
    """ninja's own log (whatever version this ninja writes) becomes the costs."""
    (tmp_path / "build.ninja").write_text(
        "rule cc\n  command = sleep $secs && touch $out\n"
        + "".join(f"build csrc/{u}.o: cc\n  secs = {s / 500:.2f}\n" for u, s in UNITS.items()))
    subprocess.run(["ninja", "-j", "2"], cwd=tmp_path, check=True, capture_output=True)
    log = tmp_path / ".ninja_log"
    assert {e.unit for e in parse_ninja_log(log.read_text())} == set(UNITS)
    entry = cost_store.learn_from_build("causal-conv1d", "1.7.0", log, ("90",), {"NVCC_THREADS": "1"})
    assert entry is not None and entry.jobs == 2
    assert all(abs(entry.units[u] - s / 500) < 0.3 for u, s in UNITS.items())
    assert plan.plan_build(node(2, 23), "causal-conv1d", ("90",)).unit_order[0] == "causal_conv1d_update"


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not installed")
def test_a_real_ninja_log_of_two_runs(tmp_path: Path) -> None:
    """Two ninja runs in one build folder, as torch's BuildExtension runs one per extension of a
    setuptools build: the second run's times restart at 0 in the log, yet its edges come out after
    the first's, grouped apart."""
    for units in ({"a": 1.2, "a_cuda": 0.6}, {"b": 0.3, "b_cuda": 0.6}):
        (tmp_path / "build.ninja").write_text(
            "rule cc\n  command = sleep $secs && touch $out\n"
            + "".join(f"build csrc/{u}.o: cc\n  secs = {s}\n" for u, s in units.items()))
        subprocess.run(["ninja", "-j", "2"], cwd=tmp_path, check=True, capture_output=True)
        # setuptools links the extension before the next run: without that gap, two runs' edges
        # are within the filesystem clock's tick of each other.
        time.sleep(0.3)
    edges = parse_ninja_log((tmp_path / ".ninja_log").read_text())
    assert unit_costs.ninja_runs(edges) == (("a", "a_cuda"), ("b", "b_cuda"))
    first_end = max(e.end_ms for e in edges if e.run == 0)
    assert all(e.start_ms >= first_end for e in edges if e.run == 1)


def test_plan_compare_prints_the_planners_error_on_a_second_build(tmp_path: Path, own_cost_store: Path) -> None:
    """`extforge plan --compare FIRST SECOND`, from the installed package: the old code had it
    only as bench/planner_error.py, which the package lacks (its `extforge plan` refused
    --compare, exit 2). The first log is learned as `extforge build` learns it, never into the
    site's store."""
    first, second = tmp_path / "first.ninja_log", tmp_path / "second.ninja_log"
    first.write_text(ninja_log(UNITS, 2))
    # The second build on a machine 10% slower, its units started longest first.
    second.write_text(ninja_log({u: UNITS[u] * 1.1 for u in sorted(UNITS, key=lambda u: -UNITS[u])}, 2))
    r = run_extforge("plan", "--compare", str(first), str(second))
    assert r.returncode == 0, r.stderr
    assert "planner error on second build: -9.1%" in r.stderr and "in the second's start order: 410.0 s" in r.stderr
    assert not own_cost_store.exists()
    # A build of four ninja runs (torch-scatter's extensions), the second 20% slower: run by run.
    first.write_text(ninja_log(SCATTER, 16, runs=4))
    second.write_text(ninja_log({u: s * 1.2 for u, s in SCATTER.items()}, 16, runs=4))
    r = run_extforge("plan", "--compare", str(first), str(second))
    assert "in 4 ninja run(s), 3 at once" in r.stderr and "planner error on second build: -16.7%" in r.stderr
    # docs/benchmarks.md's figure: causal-conv1d on 2 cores, its backward unit in two parts, each
    # build's split log beside its ninja log.
    logs = BENCH / "data" / "2026-11-28-dev-2cores-causal-conv1d-parts"
    r = run_extforge("plan", "--compare", f"{logs}.ninja_log", f"{logs}-second.ninja_log", "--json")
    out = json.loads(r.stdout)
    assert out["parts"] == {"causal_conv1d_bwd": 2} and out["slots"] == 3
    assert (round(out["predicted_seconds"], 1), round(out["measured_seconds"], 1), round(100 * out["error"], 1)) == (
        384.8, 404.2, -4.8)


def test_plan_compare_says_in_one_line_what_it_cannot_predict(tmp_path: Path) -> None:
    first, other, empty = tmp_path / "first.ninja_log", tmp_path / "other.ninja_log", tmp_path / "empty.ninja_log"
    first.write_text(ninja_log(UNITS, 2))
    other.write_text(ninja_log({"causal_conv1d": 60.0, "flash_api": 30.0}, 2))
    empty.write_text("# ninja log v5\n")
    for args, error in [((first, other), "error: the second build compiled units the first did not: flash_api"),
                        ((empty, first), "error: cannot learn from the first build's ninja log"),
                        ((first, empty), "error: the second build's ninja log has no finished compile"),
                        ((first, tmp_path / "missing.ninja_log"), "error: cannot read")]:
        r = run_extforge("plan", "--compare", *map(str, args))
        assert r.returncode == 2 and error in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_plan_node_speed_from_a_builds_ninja_log(tmp_path: Path, own_cost_store: Path) -> None:
    """`extforge plan --node-speed-from LOG` plans at the speed a build on the node type showed
    (the old code pointed `--help` at bench/unit_costs_fit.py, which the package lacks)."""
    learn(tmp_path)
    log = tmp_path / "second.ninja_log"
    log.write_text(ninja_log({u: UNITS[u] * 1.2 for u in plan.plan_build(node(2, 23), "causal-conv1d", ("90",)).unit_order}, 2))
    args = ["plan", "--profile", "causal-conv1d", "--archs", "90", "--cores", "2", "--memory", "23G"]
    r = run_extforge(*args, "--node-speed-from", str(log), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["node_speed"] == 1.2
    assert out["plan"]["expected_wall_seconds"] == plan.plan_build(node(2, 23), "causal-conv1d", ("90",),
                                                                   node_speed=1.2).expected_wall_seconds
    r = run_extforge(*args, "--node-speed-from", str(log))
    assert f"node speed from {log}: 1.2 " in r.stderr
    r = run_extforge("plan", "--profile", "never-built", "--node-speed-from", str(log))
    assert r.returncode == 2 and "error: cannot read a node speed from" in r.stderr and "no per-unit costs" in r.stderr


def test_a_learned_recipe_shows_progress_and_its_machines_speed(tmp_path: Path) -> None:
    learn(tmp_path)
    # The next build on a machine 1.2x slower, units longest first as the planner orders them.
    second = {u: UNITS[u] * 1.2 for u in plan.plan_build(node(2, 23), "causal-conv1d", ("90",)).unit_order}
    full = ninja_log(second, 2)
    assert plan.build_node_speed("causal-conv1d", full, ("90",), 1) == 1.2
    # Three of four units done, the longest still compiling: the time left at that speed.
    partial = "".join(line + "\n" for line in full.splitlines() if "causal_conv1d_update.o" not in line)
    progress = plan.build_progress(node(2, 23), "causal-conv1d", ("90",), partial, 0.0)
    assert progress is not None and (progress.done, progress.total) == (3, 4) and progress.node_speed == 1.2
    assert progress.describe().startswith("compiling: units 3/4, ~18 s left (this machine: 1.20x")
    # A recipe never built has no unit count here: the units done alone.
    assert plan.build_progress(node(2, 23), "never-built", ("90",), partial, 0.0).describe() == \
        "compiling: 3 units done"
