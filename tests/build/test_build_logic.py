"""extforge build's pure parts: solve-failure extraction, variant overrides, recipe/channel checks."""

import shutil
import time
from pathlib import Path

import pytest

from extforge.building.build import build_failure, missing_names, solve_context, solve_failure
from extforge.channel_ref import channel_url
from extforge.doctor.explain import explain_text
from extforge.engine import engine_failure, find_recipe
from extforge.errors import ExtforgeError
from extforge.recipes.variants import parse_variant_overrides

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _flash_attn_costs():
    """flash-attn's builds are planned from the costs its recipe folder ships."""
    from recipe_costs import shipped

    with shipped("flash-attn"):
        yield

LOG = [
    "info: Starting build of 1 outputs",
    "info:   Platform: linux-64 [__unix=0=0, __linux=6.1=0, __glibc=2.36=0, __cuda=13.0=0]",
    "info:   Channels: ",
    "info:    - file:///ch/",
    "info:   Specs:",
    "info:    - python 3.9.*",
    "info:    - pytorch 2.14.1.*",
    "info:    - nosuchpkg >=1",
    "info: subdir linux-64 of channel file:///ch/ was not found, ignoring",
]


def test_solve_context_reads_the_last_solve():
    specs, platform = solve_context(LOG)
    assert specs == ["python 3.9.*", "pytorch 2.14.1.*", "nosuchpkg >=1"]
    assert platform.startswith("linux-64 [")
    assert missing_names(specs, {"python", "pytorch"}) == ["nosuchpkg >=1"]


def test_solve_failure_names_what_is_missing(tmp_path):
    err = solve_failure(LOG, ["file:///nonexistent/"], tmp_path / "build.log")
    assert "python 3.9.*" in err.what and "nosuchpkg >=1" in err.what
    assert "build.log" in err.fix


def test_variant_overrides():
    assert parse_variant_overrides(["python=3.12", "cuda_archs=8.0, 9.0"]) == {
        "python": ["3.12"],
        "cuda_archs": ["8.0", "9.0"],
    }
    with pytest.raises(ExtforgeError):
        parse_variant_overrides(["python"])


def test_missing_recipe_and_channel_are_clear_errors(tmp_path):
    with pytest.raises(ExtforgeError, match="no recipe at"):
        find_recipe(tmp_path / "nope")
    with pytest.raises(ExtforgeError, match="neither a URL nor an existing folder"):
        channel_url(tmp_path / "no-channel")
    assert channel_url(tmp_path) == tmp_path.resolve().as_uri()
    assert channel_url("http://127.0.0.1:8000/ch") == "http://127.0.0.1:8000/ch"


def test_planner_gets_the_archs_of_the_variant():
    """The planner must see the variant's sm_90 alone, not the default A100+H100 pair (on an H100
    node that is 16x1 jobs instead of 8x2: 17 min, not 50)."""
    from extforge import machine
    from extforge.building.build import build_environment
    from extforge.planning import plan

    here = machine.detect()
    env = build_environment("", [], {"cuda_archs": ["9.0"]}, "flash-attn")
    want = plan.plan_build(here, "flash-attn", ["90"]).env()
    assert {k: env[k] for k in want} == want
    h100 = machine.Machine(16, 128 * 2**30, "2.39", "test", "test")
    h100_env = plan.plan_build(h100, "flash-attn", ["90"]).env()
    assert (h100_env["MAX_JOBS"], h100_env["NVCC_THREADS"]) == ("16", "1")


def test_planner_gets_the_units_of_a_subset_variant():
    """The planner orders (and splits) only the units a head-dim subset build compiles (which,
    the recipe's data says)."""
    from extforge.building.build import build_environment

    env = build_environment("", [], {"cuda_archs": ["9.0"], "flash_attn_head_dims": ["128"]}, "flash-attn")
    order = env["EXTFORGE_UNIT_ORDER"].split(";")
    assert "flash_api" in order and {u.split("_hdim")[1][:3] for u in order if "_hdim" in u} == {"128"}


def test_the_planners_variables_reach_the_recipe_through_the_layer(tmp_path, monkeypatch):
    """flash-attn's recipe read MAX_JOBS, NVCC_THREADS and the unit order with env.get when it was
    rendered (a render outside them gave the recipe's defaults: 2 jobs, upstream order, a 13-unit
    build at 3 units in 14 min on an H100 node). On the layer they reach its build through the
    settings file the activation reads, whatever the render saw."""
    import subprocess

    from test_variant_requests import channel_of

    from extforge import machine
    from extforge.building.build import build_environment
    from extforge.recipes import build_layer
    from extforge.recipes.variants import resolve

    monkeypatch.setattr(machine, "detect", lambda: machine.Machine(16, 128 * 2**30, "2.39", "test", "test"))
    recipe = REPO / "recipe" / "flash-attn" / "recipe.yaml"
    assert "env.get(\"MAX_JOBS\"" not in recipe.read_text() and build_layer.uses_layer(recipe.read_text())
    channel = channel_of(tmp_path / "mirror", [("3.11", "2.14.1", "13.0", "cxx11")])
    matrix = resolve(recipe, [str(channel)], [recipe.parent / "variants-offline.yaml"],
                     {"flash_attn_head_dims": ["128"], "cuda_archs": ["8.0;9.0"]})
    env = build_environment(recipe.read_text(), [str(channel)], matrix.values, "flash-attn")
    assert (env["MAX_JOBS"], env["NVCC_THREADS"]) == ("8", "2") and env["EXTFORGE_UNIT_ORDER"]
    settings = build_layer.write_settings(tmp_path / "out", env)
    shown = subprocess.run(["bash", "-c", f'source {settings}; echo "$MAX_JOBS $NVCC_THREADS $EXTFORGE_UNIT_ORDER"'],
                           capture_output=True, text=True, check=True).stdout.split()
    assert shown == [env["MAX_JOBS"], env["NVCC_THREADS"], env["EXTFORGE_UNIT_ORDER"]]


def test_a_failed_build_names_its_cause_from_its_own_log(tmp_path):
    """torch 2.9.1's tuple-form CUDA mismatch, as the build log holds it (tests/explain/data)."""
    data = Path(__file__).parents[1] / "explain" / "data" / "cuda-mismatch-tuple-torch-2.9.1.txt"
    lines = [ln for ln in data.read_text().splitlines() if not ln.startswith("#")]
    err = build_failure(RuntimeError("Script failed with status 1"), lines, ["file:///ch"],
                        tmp_path / "demo-ext" / "recipe.yaml", tmp_path / "build.log", [])
    assert err.what == "building demo-ext failed: nvcc 13.0 does not match torch's CUDA 12.8"
    assert "compilePyTorch" in err.why and "extforge mirror" in err.fix and str(tmp_path / "build.log") in err.fix


def test_a_build_from_an_sdist_without_its_sources_says_so(tmp_path):
    """fast-hadamard-transform 1.1.0 built from PyPI's sdist (no csrc/): the old error was
    rattler-build's "Script failed to execute", the cause only in the log; and a diagnosis's fix
    ending in a full stop read ".; build log"."""
    lines = ["info:   ninja: error: '$SRC_DIR/csrc/fast_hadamard_transform.cpp', needed by "
             "'$SRC_DIR/build/temp.linux-x86_64-cpython-311/csrc/fast_hadamard_transform.o', missing and no known rule to make it",
             "info:   subprocess.CalledProcessError: Command '['ninja', '-v', '-j', '2']' returned non-zero exit status 1.",
             "info:   RuntimeError: Error compiling objects for extension", "error: Script failed with status 1"]
    err = build_failure(RuntimeError("Script failed to execute"), lines, ["file:///ch"],
                        tmp_path / "fast-hadamard-transform" / "recipe.yaml", tmp_path / "build.log", [])
    assert err.what == ("building fast-hadamard-transform failed: a source the build compiles is not in the source archive "
                        "($SRC_DIR/csrc/fast_hadamard_transform.cpp)")
    assert "archive of the release's tag" in err.fix and ".;" not in err.fix


def test_a_full_disk_is_named_not_taken_for_a_solve_failure(tmp_path, monkeypatch):
    """rattler-build says "Failed to resolve dependencies" when it cannot unpack a package for
    lack of space; with the disk nearly full the error names the disk instead."""
    import extforge.building.build as build

    rattler_says = RuntimeError("PyRattlerBuildError: Failed to resolve dependencies")
    lines = ["info: ✔ Successfully updated the build environment"]
    solve = build_failure(rattler_says, lines, ["file:///nonexistent/"], tmp_path / "demo-ext" / "recipe.yaml",
                          tmp_path / "build.log", [])
    assert "disk" not in solve.what  # plenty of space: a solve failure it is
    monkeypatch.setattr(build, "LOW_DISK_BYTES", shutil.disk_usage(tmp_path).free * 2)
    err = build_failure(rattler_says, lines, ["file:///nonexistent/"], tmp_path / "demo-ext" / "recipe.yaml",
                        tmp_path / "build.log", [])
    assert err.what == "building demo-ext failed: the disk is full"
    assert "GiB free on the disk of" in err.why and "EXTFORGE_CACHE" in err.fix


def test_rattlers_unpack_error_is_explained_as_a_full_disk():
    text = ("failed to fetch nvidia-curand-cu12-10.3.9.90-py312_hb0f4dca_0.conda\nCaused by: an io error occurred: "
            "failed to unpack `lib/python3.12/site-packages/nvidia/curand/lib/libcurand.so.10`: No space left on device (os error 28)")
    (diagnosis, *_) = explain_text(text).diagnoses
    assert diagnosis.id == "disk-full"


def test_a_rattler_build_panic_is_an_error_not_a_traceback(tmp_path):
    """pyo3 turns a Rust panic into a BaseException; build_failure still names it."""
    panic = type("PanicException", (BaseException,), {})("Failed to parse the ELF file: Scroll(BadInput)")
    assert engine_failure(panic) and not engine_failure(KeyboardInterrupt())
    err = build_failure(panic, ["info: Copying done!"], ["file:///ch"], tmp_path / "x" / "recipe.yaml",
                        tmp_path / "build.log", [])
    assert err.what.startswith("building x failed: rattler-build crashed (panic): Failed to parse the ELF file")
def test_build_passes_the_longest_first_unit_order():
    """ninja starts units in the order torch writes build.ninja: flash-attn's build script ranks the
    sources by EXTFORGE_UNIT_ORDER, the measured longest (a non-causal split-kv forward) first."""
    from extforge.building.build import build_environment

    env = build_environment("", [], {"cuda_archs": ["9.0"]}, "flash-attn")
    order = env["EXTFORGE_UNIT_ORDER"].split(";")
    assert len(order) == 73 and order[0].startswith("flash_fwd_split_") and "_causal" not in order[0]
    assert order.index("flash_bwd_hdim32_fp16_sm80") < order.index("flash_fwd_hdim32_fp16_sm80")
    assert "EXTFORGE_UNIT_ORDER" not in build_environment("", [], {}, "no-such-profile")


def ninja_log_text(costs: dict[str, float], jobs: int, speed: float) -> str:
    """A ninja log of a build whose machine compiles every unit in `speed` of `costs`."""
    from extforge.planning.plan import numbers_for
    from extforge.planning.unit_costs import list_schedule

    data = numbers_for("flash-attn").costs
    assert data is not None
    spans = list_schedule([(u, s * speed) for u, s in costs.items()], jobs, data.concurrency).spans
    return "# ninja log v7\n" + "".join(f"{round(a * 1000)}\t{round(b * 1000)}\t0\tsrc/{u}.o\th\n" for u, (a, b) in spans.items())


@pytest.mark.parametrize(("archs", "threads"), [(["90"], 1), (["80", "90"], 2)])
def test_a_finished_build_reports_its_machines_speed(tmp_path: Path, archs: list[str], threads: int) -> None:
    """The build's ninja log, read before its work folder goes, gives the speed the next plan
    on this machine takes (`extforge plan --node-speed`)."""
    from extforge.building.build import measured_node_speed
    from extforge.planning.plan import numbers_for, unit_seconds
    from extforge.planning.unit_costs import in_variant

    numbers = numbers_for("flash-attn")
    assert numbers.costs is not None
    per_unit = in_variant(unit_seconds(numbers.profile, numbers.costs, len(archs), threads), numbers.costs.subsets,
                          {"flash_attn_head_dims": ["128"]})
    work = tmp_path / "rattler-build_flash-attn_1" / "work" / "build" / "temp.linux-x86_64-cpython-312"
    work.mkdir(parents=True)
    (work / ".ninja_log").write_text(ninja_log_text(per_unit, 8, 0.8))
    variants = {"cuda_archs": [";".join(f"{a[0]}.{a[1:]}" for a in archs)]}
    speed = measured_node_speed("flash-attn", [tmp_path / "rattler-build_flash-attn_1"], variants,
                                {"NVCC_THREADS": str(threads)}, None)
    assert speed == pytest.approx(0.8, abs=0.01)
    # A recipe without unit costs, or a build that left no log, reports nothing.
    assert measured_node_speed("demo-ext", [tmp_path / "rattler-build_flash-attn_1"], variants, {}, None) is None
    assert measured_node_speed("flash-attn", [tmp_path / "elsewhere"], variants, {}, None) is None


def test_the_build_line_tells_the_next_plans_node_speed(tmp_path: Path) -> None:
    from extforge.building.build import BuiltPackage
    from extforge.commands.build import built_line

    pkg = BuiltPackage(tmp_path / "flash-attn-2.8.3-x_0.conda", "flash-attn", "2.8.3", "x_0", "linux-64", "pass", node_speed=0.745)
    assert "extforge plan --node-speed 0.745" in built_line(pkg)
    assert pkg.to_json()["node_speed"] == 0.745
    assert "--node-speed" not in built_line(BuiltPackage(pkg.path, "demo-ext", "0.1", "x_0", "linux-64", "pass"))


def test_a_running_build_reports_its_progress_from_ninjas_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile of a flash-attn build reports units done and the time left while it runs, from
    rattler-build's log callback (it holds the GIL while building: no thread of ours would run),
    read from the log ninja appends to in the variant's work folder, which appears after the
    build started; to the screen and the build log."""
    from types import SimpleNamespace

    from extforge.building.build import Planned, progress_reports
    from extforge.engine import LogSink
    from extforge.planning.plan import numbers_for, unit_seconds

    numbers = numbers_for("flash-attn")
    assert numbers.costs is not None
    per_unit = unit_seconds(numbers.profile, numbers.costs, 1, 1)
    bld = tmp_path / "bld"
    (bld / "rattler-build_earlier_1" / "work").mkdir(parents=True)  # an earlier variant's folder is not read
    (bld / "rattler-build_earlier_1" / "work" / ".ninja_log").write_text(ninja_log_text(per_unit, 16, 0.8))
    before = set(bld.glob("rattler-build_*"))
    screen: list[str] = []
    with (tmp_path / "build.log").open("w") as fh:
        sink = LogSink(fh, screen.append)
        line = SimpleNamespace(level="info", message="[10/73] nvcc ...")
        variants = {"cuda_archs": ["9.0"]}
        with progress_reports(sink, bld, before, Planned("flash-attn", variants), interval=0):
            sink.on_log(line)
            assert screen == []
            temp = bld / "rattler-build_flash-attn_2" / "work" / "build" / "temp.linux-x86_64-cpython-312"
            temp.mkdir(parents=True)
            (temp / ".ninja_log").write_text(ninja_log_text(dict(list(per_unit.items())[:10]), 16, 0.8))
            # One moment for every report: on a loaded machine a second passed between two
            # reports, and the time left they said differed by it.
            now = time.time()
            monkeypatch.setattr(time, "time", lambda: now)
            sink.on_log(line)
            sink.on_log(line)  # the same estimate is not said twice
        sink.on_log(line)  # nor after the variant's build
        with progress_reports(sink, bld, set(), Planned("flash-attn", variants), interval=3600):
            sink.on_log(line)  # at most one report an interval: the last was moments ago
    assert len(screen) == 1 and screen[0].startswith("compiling: units 10/73, ~") and "0.80x" in screen[0]
    assert f"== {screen[0]}" in (tmp_path / "build.log").read_text().splitlines()
