"""extforge.planning.plan: settings that fit memory, calibrated on the measured H100 build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extforge.cli import main
from extforge.errors import ExtforgeError
from extforge.machine import GIB, Machine, parse_memory
from extforge.planning.plan import numbers_for, plan_build, slurm_request

RECIPES = Path(__file__).resolve().parents[2] / "recipe"


def node(cores: int, gib: float) -> Machine:
    return Machine(cores=cores, memory_bytes=int(gib * GIB), glibc="2.36", cores_source="test", memory_source="test")


@pytest.mark.parametrize("cores,gib", [(16, 128), (2, 24), (16, 64), (64, 256), (8, 12), (128, 64)])
@pytest.mark.parametrize("archs", [("90",), ("80", "90"), ("80", "90", "100", "120")])
def test_predicted_peak_never_exceeds_limit(cores: int, gib: float, archs: tuple[str, ...]) -> None:
    plan = plan_build(node(cores, gib), "flash-attn", archs)
    assert plan.predicted_peak_bytes <= plan.memory_limit_bytes < gib * GIB
    assert 1 <= plan.max_jobs and plan.max_jobs * plan.nvcc_threads <= cores
    env = plan.env()
    assert (env["MAX_JOBS"], env["NVCC_THREADS"]) == (str(plan.max_jobs), str(plan.nvcc_threads))
    assert sorted(env["EXTFORGE_UNIT_ORDER"].split(";")) == sorted(plan.unit_order) and len(plan.unit_order) >= 73


def test_reproduces_the_measured_h100_build() -> None:
    # Measured on an H100 node, MAX_JOBS=16, NVCC_THREADS=1, sm_90, 73 units, with the compilers
    # extforge picks (/usr/bin/g++): 1407 s in upstream's order (run G), peak 64-70 GiB.
    plan = plan_build(node(16, 128), "flash-attn", ("90",))
    assert (plan.max_jobs, plan.nvcc_threads) == (16, 1)
    assert abs(plan.predicted_peak_bytes / 1e9 - 73) < 6
    # The per-unit data predicts that build within the speeds of the nodes measured so far
    # (0.75-1.15x the data's; tests/plan/test_unit_costs.py checks it at run J's node speed);
    # extforge starts the units longest first, which is shorter.
    assert plan.upstream_order_wall_seconds is not None
    assert 0.75 * plan.upstream_order_wall_seconds < 1407 < 1.15 * plan.upstream_order_wall_seconds
    assert plan.expected_wall_seconds < plan.upstream_order_wall_seconds


def test_predicts_the_measured_head_dim_128_build() -> None:
    # The head-dim-128 build on that node, no unit split: 447 s from start to package, 18 s before
    # the first nvcc. (With 13 units on 16 slots upstream's order is the longest-first schedule.)
    plan = plan_build(node(16, 128), "flash-attn", ("90",), variant={"flash_attn_head_dims": ["128"]})
    assert plan.upstream_order_wall_seconds is not None
    assert abs(plan.upstream_order_wall_seconds - (447 - 18)) < 0.1 * 447


def test_memory_not_cores_limits_a_small_node() -> None:
    plan = plan_build(node(16, 24), "flash-attn", ("90",))
    assert plan.max_jobs < 16
    assert any("memory, not cores" in r for r in plan.reasons)


def test_more_archs_take_longer() -> None:
    one = plan_build(node(16, 128), "flash-attn", ("90",))
    two = plan_build(node(16, 128), "flash-attn", ("80", "90"))
    assert two.expected_wall_seconds > 1.5 * one.expected_wall_seconds


def test_too_little_memory_is_an_error() -> None:
    with pytest.raises(ExtforgeError, match="not enough"):
        plan_build(node(4, 6), "flash-attn", ("90",))


def test_slurm_request_replans_to_the_same_settings() -> None:
    plan = plan_build(node(16, 128), "flash-attn", ("90",))
    req = slurm_request(plan)
    assert req.sbatch_args() == ["--cpus-per-task=16", f"--mem={req.mem}", f"--time={req.time}"]
    inside = plan_build(node(req.cpus_per_task, parse_memory(req.mem) / GIB), "flash-attn", ("90",))
    assert (inside.max_jobs, inside.nvcc_threads) == (plan.max_jobs, plan.nvcc_threads)
    h, m, s = map(int, req.time.split(":"))
    assert h * 3600 + m * 60 + s > plan.expected_wall_seconds


def test_recipe_folders_ship_their_numbers_and_the_product_none() -> None:
    """flash-attn's and FA3's numbers were the product's (data/build-profiles.yaml, unit-costs.yaml);
    they are their recipes' now, and a name nobody measured gets the default estimate."""
    assert numbers_for("flash-attn").profile.translation_units == 73
    assert numbers_for("flash-attn-3").profile.one_arch_per_unit
    assert numbers_for("demo-ext").costs is None  # its folder's numbers count where its folder is planned
    data = Path(__file__).resolve().parents[2] / "src" / "extforge" / "data"
    assert not (data / "unit-costs.yaml").exists() and "flash-attn:" not in (data / "build-profiles.yaml").read_text()
    unknown = numbers_for("no-such-recipe")
    assert unknown.costs is None and unknown.source.startswith("default estimate")


@pytest.mark.parametrize("text,value", [("128G", 128 * GIB), ("64GiB", 64 * GIB), ("512M", 512 * 1024**2), ("1024", GIB)])
def test_parse_memory(text: str, value: int) -> None:
    assert parse_memory(text) == value


def test_cli_plans_a_subset_variant_from_its_own_units(capsys) -> None:
    """`extforge plan --variant` plans what `extforge build --variant` builds: FA3 at head dim 128
    with bf16+fp16, softcap and split is 11 units, not the full build's 293."""
    base = ["plan", str(RECIPES / "flash-attn-3"), "--cores", "8", "--memory", "120G", "--json"]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)["plan"]
    assert main([*base, "--variant", "fa3_head_dims=128", "--variant", "fa3_dtypes=bf16;fp16",
                 "--variant", "fa3_features=softcap;split", "--variant", "cuda_archs=sm_90a"]) == 0
    subset = json.loads(capsys.readouterr().out)["plan"]
    assert len(subset["unit_order"]) == 11 and len(full["unit_order"]) == 293
    assert subset["expected_wall_seconds"] < full["expected_wall_seconds"] / 5


def test_cli_json_for_both_reference_nodes(capsys) -> None:
    for cores, mem in ((16, "128G"), (2, "24G")):
        assert main(["plan", str(RECIPES / "flash-attn"), "--cores", str(cores), "--memory", mem, "--archs", "80,90",
                     "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["plan"]["predicted_peak_bytes"] <= out["plan"]["memory_limit_bytes"]
        assert out["env"]["MAX_JOBS"] == str(out["plan"]["max_jobs"])
        assert out["slurm"]["sbatch_args"][0] == f"--cpus-per-task={out['slurm']['cpus_per_task']}"


def test_node_speed_scales_the_compiles_not_the_settings() -> None:
    # Run P (a 16-core H100 node, 2026-11-26): the full sm_90 build compiled in 850 s; its units
    # ran at 0.745 of the data's seconds. Scaled so, the plan is within 10% of it.
    base = plan_build(node(16, 125.9), "flash-attn", ("90",))
    fast = plan_build(node(16, 125.9), "flash-attn", ("90",), node_speed=0.745)
    assert (fast.max_jobs, fast.nvcc_threads, fast.unit_order) == (base.max_jobs, base.nvcc_threads, base.unit_order)
    link = numbers_for("flash-attn").profile.link_seconds
    assert fast.expected_wall_seconds - link == pytest.approx(0.745 * (base.expected_wall_seconds - link), abs=2)
    assert abs(fast.expected_wall_seconds - link - 850) < 0.1 * 850
    assert any("--node-speed" in r for r in fast.reasons)
    with pytest.raises(ValueError):
        plan_build(node(16, 128), "flash-attn", ("90",), node_speed=0.0)


@pytest.mark.parametrize("speed", ["0", "-1", "nan", "fast"])
def test_a_node_speed_that_is_no_positive_number_is_refused(speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", "flash-attn", "--node-speed", speed]) == 2
    assert "argument --node-speed" in capsys.readouterr().err


def test_two_arch_peak_covers_the_measured_build() -> None:
    # The head-dim-128 subset for sm_80 + sm_90, MAX_JOBS=8 NVCC_THREADS=2, peaked at 61.9 GiB
    # above idle on a 16-core, 125.9 GiB H100 node (2026-11-26); the plan before said 47.2.
    plan = plan_build(node(16, 125.9), "flash-attn", ("80", "90"), variant={"flash_attn_head_dims": ["128"]})
    assert (plan.max_jobs, plan.nvcc_threads) == (8, 2)
    assert plan.predicted_peak_bytes >= 61.9 * GIB


def test_the_plan_shows_the_wall_time_over_the_measured_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    # Run P's full build (16 cores, longest first) compiled for 850 s: within the range the
    # measured node speeds give, though 24% under the nominal prediction.
    plan = plan_build(node(16, 125.9), "flash-attn", ("90",))
    assert plan.wall_range_seconds is not None
    fastest, slowest = plan.wall_range_seconds
    link = numbers_for("flash-attn").profile.link_seconds
    assert fastest < 850 + link < plan.expected_wall_seconds < slowest
    # The Slurm request covers the slowest node measured.
    h, m, s = map(int, slurm_request(plan).time.split(":"))
    assert h * 3600 + m * 60 + s > slowest
    # A node type measured once has its own speed: no range.
    assert plan_build(node(16, 125.9), "flash-attn", ("90",), node_speed=0.745).wall_range_seconds is None
    assert main(["plan", str(RECIPES / "flash-attn"), "--cores", "16", "--memory", "125.9G", "--archs", "90"]) == 0
    shown = capsys.readouterr()
    assert "on the nodes measured so far" in shown.out + shown.err


def test_fa3_units_compile_for_one_arch_each_whatever_the_variant_names() -> None:
    """FA3's sm80 kernels are files of their own: naming sm_80 beside sm_90 adds no work per unit,
    while flash-attn compiles every unit once per arch (two nvcc threads pay off there)."""
    one, two = (plan_build(node(64, 512), "flash-attn-3", archs) for archs in (("90",), ("80", "90")))
    assert (two.max_jobs, two.nvcc_threads, two.expected_wall_seconds) == (one.max_jobs, 1, one.expected_wall_seconds)
    assert any("1 arch(s) per unit" in r for r in two.reasons)
    assert plan_build(node(64, 512), "flash-attn", ("80", "90")).nvcc_threads == 2


@pytest.mark.parametrize(("variant", "units"), [
    ({}, 293),
    ({"fa3_head_dims": ["128"], "fa3_dtypes": ["bf16;fp16"], "fa3_features": ["bwd;varlen"], "cuda_archs": ["9.0a"]}, 6),
    # run X's set: no softcap, so upstream builds the `_softcapall` backward units under plain names
    ({"fa3_head_dims": ["all"], "fa3_dtypes": ["bf16;fp8"], "fa3_features": ["appendkv;bwd;cluster;local;packgqa;paged;split;varlen"],
      "cuda_archs": ["9.0a"]}, 58),
    ({"fa3_head_dims": ["64"], "fa3_dtypes": ["bf16"], "fa3_features": ["varlen"], "cuda_archs": ["9.0a"]}, 3),
    # upstream's A100 code path (sm80 units) goes with 8.0 in the variant's archs
    ({"fa3_head_dims": ["64"], "fa3_dtypes": ["bf16"], "fa3_features": ["varlen"], "cuda_archs": ["8.0;9.0a"]}, 4),
])
def test_an_fa3_subset_is_planned_from_its_own_units(variant, units) -> None:
    """The unit counts upstream's setup.py builds for these subsets (runs L, X and Y compiled 6, 58, 3)."""
    built = plan_build(node(64, 512), "flash-attn-3", ("90",), variant=variant)
    assert len(built.unit_order) == units
    full = plan_build(node(64, 512), "flash-attn-3", ("90",))
    assert (built.expected_wall_seconds < full.expected_wall_seconds) == (units < 293)
