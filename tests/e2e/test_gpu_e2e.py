"""node/gpu_e2e, the GPU node pipeline: what its phases share through the work folder, and its
pure parts, on any machine (the pipeline itself runs on a GPU node)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "node"))

from gpu_e2e import builds, carry, cli, node, phases, state, wheels


def _options(work: Path, *argv: str) -> phases.Options:
    args = cli.parser().parse_args([*argv, "--work", str(work), "--out", str(work / "out")])
    return cli.options(args, state.Run(work, work / "out").state["options"])


def _start(work: Path, *argv: str) -> phases.Options:
    """What `start` remembers, without running it."""
    o = _options(work, "start", *argv)
    state.Run(work, work / "out").remember({k: getattr(o, k) for k in state.REMEMBERED})
    return o


def test_finish_takes_what_start_was_given(tmp_path):
    """`finish --env fa3` after `start --fa3` locked without flash-attn-3 until --fa3 was given again."""
    _start(tmp_path, "--fa3", "--archs", "80;90", "--head-dims", "128", "--python", "/node/python3")
    o = _options(tmp_path, "finish", "--env", "fa3")
    assert (o.fa3, o.archs, o.head_dims, o.python, o.env) == (True, "80;90", "128", "/node/python3", "fa3")
    # Given again, an option wins; an option start never remembers keeps its own default.
    o = _options(tmp_path, "finish", "--archs", "90")
    assert (o.archs, o.fa3, o.env, o.rebuild) == ("90", True, "runtime", False)


def test_a_new_start_forgets_the_last_runs_options(tmp_path):
    _start(tmp_path, "--fa3", "--side-by-side")
    o = _start(tmp_path)
    assert (o.fa3, o.side_by_side, o.archs) == (False, False, "90")
    assert _options(tmp_path, "wait").fa3 is False


def test_merged_options_take_only_remembered_keys():
    merged = state.merged_options({"archs": None, "fa3": None}, {"archs": "80", "env": "fa3", "fa3": True},
                                  {"archs": "90", "fa3": False, "env": "runtime"})
    assert merged == {"archs": "80", "fa3": True, "env": "runtime"}


def test_phases_and_steps_are_recorded_and_summarized(tmp_path):
    run = state.Run(tmp_path, tmp_path / "out")
    run.begin("start")
    run.step("say hello", [sys.executable, "-c", "print('hello')"])
    with pytest.raises(state.StepFailed):
        run.step("fail loudly", [sys.executable, "-c", "import sys; print('boom'); sys.exit(4)"])
    run.fact("device", "H100")
    run.end("stopped at 'fail loudly'")
    again = state.Run(tmp_path, tmp_path / "out2")  # the next call, its output folder empty
    assert [p["phase"] for p in again.state["phases"]] == ["start"] and again.has_step("say hello")
    assert not again.ok()
    again.save()
    summary = (tmp_path / "out2" / "summary.md").read_text()
    assert "- device: H100" in summary and "| fail loudly | FAILED (exit 4) |" in summary
    assert "- start: " in summary and "stopped at 'fail loudly'" in summary and "boom" in summary
    assert "**1 of 2 steps passed.**" in summary
    assert json.loads((tmp_path / "out2" / "summary.json").read_text())["facts"] == {"device": "H100"}


def test_a_state_written_before_phases_were_kept_still_loads(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"started": "2026-11-26T10:00:00+00:00", "steps": [], "facts": {}}))
    loaded = state.load_state(tmp_path / "state.json")
    assert loaded["phases"] == [] and loaded["options"] == {}


def test_a_chained_build_runs_from_the_snapshot_when_the_tree_is_gone(tmp_path):
    """Run U's plain side, chained after the recipe build, failed with `can't open file
    'bench/build_side_by_side.py'`: a later call had laid the synced tree anew."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    for part in builds.SNAPSHOT_PARTS:
        (repo / part).mkdir(parents=True)
    (repo / "bench" / "build_side_by_side.py").write_text("import sys; print('plain side', sys.argv[1:])\n")
    (work / "logs").mkdir(parents=True)
    tree = builds.snapshot(work, repo)
    run = state.Run(work, work / "out")
    script = phases.side_by_side_script(run)
    assert Path(script).is_absolute() and Path(script).is_relative_to(tree)
    line = builds.build_script(work, "plain-fa", [sys.executable, script, "--only", "plain"], tree, after=["build-fa"])
    waiting = subprocess.Popen(["bash", "-c", line], cwd=repo)
    shutil.rmtree(repo)  # laid anew: gone while the chained build waits
    (work / "build-fa.done").write_text("0 1.0 2.0\n")
    assert waiting.wait(timeout=30) == 0
    rc, start, end = builds.parse_done((work / "plain-fa.done").read_text())
    assert rc == 0 and end >= start
    assert (work / "logs" / "plain-fa.log").read_text() == "plain side ['--only', 'plain']\n"


def test_the_side_by_side_commands_read_only_the_work_folder(tmp_path):
    o = _start(tmp_path, "--side-by-side", "--python", "/node/python3")
    run = state.Run(tmp_path, tmp_path / "out")
    for cmd in (phases.plain_build_cmd(run, o, ["--jobs", "8"]), phases.fa_build_cmd(run, o, settings=["--jobs", "8"])):
        assert cmd[1] == str(tmp_path / "tree" / "bench" / "build_side_by_side.py")
        assert cmd[2] == str(phases.sdist(tmp_path)) and cmd[2].startswith(str(tmp_path))
    plain = phases.fa_build_cmd(run, o)
    assert plain[:4] == ["/node/python3", "-m", "extforge", "build"] and "cuda_archs=90" in plain


def test_node_words_and_cpu_halves():
    smi = "NVIDIA H100 80GB HBM3, 9.0, 580.65.06, 81559 MiB"
    assert node.describe_node(smi, 16, 125.9) == "an H100 node (16 cores, 126 GiB, no network)"
    assert node.describe_node("\n".join([smi] * 2), 32, 251.0).startswith("a node with two H100s (32 cores")
    assert node.describe_node("none", 2, 7.6) == "a GPU node (2 cores, 8 GiB, no network)"
    # Hyperthread siblings stay together, sockets in order.
    cores = {(0, 0): [0, 4], (0, 1): [1, 5], (1, 0): [2, 6], (1, 1): [3, 7]}
    assert node.halves(cores) == ([0, 4, 1, 5], [2, 6, 3, 7])
    assert node.halves({(0, 0): [0, 1]}) is None
    assert node.cpu_list([8, 0, 1, 2, 3]) == "0-3,8"
    assert node.sm_archs("80;90") == "sm_80,sm_90"
    assert node.planned('note: x\n{"plan": {"max_jobs": 8}}') == {"max_jobs": 8}


def test_progress_reads_ninjas_last_count():
    assert builds.progress_line("build-fa", "[1/73] a\n[12/73] b\n") == "build-fa: 12/73 compile steps"
    assert builds.progress_line("build-fa", "solving") == "build-fa: preparing"


@pytest.mark.parametrize(("output", "counts"), [
    ("....\n1100 passed, 3 skipped, 13200 deselected in 120.52s (0:02:00)\n",
     {"passed": 1100, "skipped": 3, "deselected": 13200}),
    ("FF.\n=== 2 failed, 1 passed, 1 error in 3.0s ===\n", {"failed": 2, "passed": 1, "error": 1}),
    # Stopped by `timeout -s INT`: pytest still prints what ran.
    ("!!!!!!! KeyboardInterrupt !!!!!!!\n500 passed, 10 skipped, 9000 deselected in 240.01s (0:04:00)\n",
     {"passed": 500, "skipped": 10, "deselected": 9000}),
    ("ImportError while loading conftest\n", {}),
])
def test_upstream_test_counts_come_from_pytests_last_summary_line(output, counts):
    assert phases.pytest_counts(output) == counts


def test_the_full_fa3_build_is_audited_for_its_sm80_kernels(tmp_path):
    full = _start(tmp_path, "--fa3", "--fa3-head-dims", "all", "--fa3-dtypes", "all", "--fa3-features", "all")
    (tmp_path / "subset").mkdir()
    subset = _start(tmp_path / "subset", "--fa3")
    assert phases.fa3_sm80(full) and not phases.fa3_sm80(subset)


def test_the_wheels_phase_needs_what_finish_published(tmp_path):
    """`wheels` makes its wheels of the very packages `finish` published; before `finish` it stops
    at once, saying so, and the summary shows why. (Before, no phase put a wheel on the node.)"""
    run = state.Run(tmp_path, tmp_path / "out")
    with pytest.raises(state.StepFailed):
        wheels.phase_wheels(run, _options(tmp_path, "wheels"))
    assert "run `finish` first" in (tmp_path / "out" / "summary.md").read_text()


def test_the_wheel_venv_is_a_copy_of_the_node_pythons_venv(tmp_path):
    """pip installs the wheels beside the node's pip torch, in its site-packages (where the wheel's
    `$ORIGIN/../torch/lib` points), in a copy: the node's venv stays what `start` mirrored. (Before,
    the node's pip torch env took part only as the mirror's upstream.)"""
    node_venv = tmp_path / "node-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(node_venv)], check=True)
    site = next(node_venv.glob("lib/python3.*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '2.11.0+cu130'\n")
    run = state.Run(tmp_path / "work", tmp_path / "out")
    python = wheels.copy_venv(run, str(node_venv / "bin" / "python3"))
    copy = tmp_path / "work" / "wheel-venv"
    assert python == str(copy / "bin" / "python3") and run.ok()
    assert str(copy) in run.state["facts"]["wheel venv"] and "2.11.0+cu130" in run.state["facts"]["wheel venv"]
    (copy / site.relative_to(node_venv) / "flash_attn.py").write_text("")
    assert not (site / "flash_attn.py").exists()
    # A python in no venv is refused, naming the option to pass.
    with pytest.raises(state.StepFailed):
        wheels.copy_venv(run, sys._base_executable)
    assert "pass --python" in run.state["steps"][-1]["tail"]


def test_the_wheels_and_the_benchmarks_are_read_from_their_json(tmp_path):
    """The wheels come from publish's JSON (its line before it skipped), and the wheel venv's benchmark
    ratios are set beside the prefix's: the issue's `same ratio within noise` is read off one fact."""
    out = ('→ publish …\n{"wheels": {"index": "/w", "wheels": [{"file": "torch2.11.0-cu130/simple/flash-attn/'
           'flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE-cp312-cp312-manylinux_2_35_x86_64.whl", "sha256": "ab", '
           '"status": "published", "audit": "pass"}], "ignored": []}}')
    (wheel,) = wheels.published_wheels(out, tmp_path)
    assert wheel.parent == tmp_path / "torch2.11.0-cu130" / "simple" / "flash-attn" and wheels.project_of(wheel) == "flash-attn"
    run = state.Run(tmp_path, tmp_path / "out")
    (tmp_path / "logs").mkdir()
    for name, ratio, fa3 in ((phases.bench_json(), 0.562, 1.239), (phases.bench_json(wheels.WHERE), 0.560, 1.241)):
        (tmp_path / "logs" / name).write_text(json.dumps({"verdict": {"ratio": ratio, "fa3": {"fwd": {"ratio": fa3}}}}))
    wheels.compare_benchmarks(run)
    assert phases.bench_json(wheels.WHERE) == "attention-bench-pip-venv.json"
    assert run.state["facts"]["attention benchmark, conda prefix vs pip venv (wheels)"] == (
        "flash-attn/SDPA fwd 0.562 vs 0.560 (-0.4%); FA3/SDPA fwd 1.239 vs 1.241 (+0.2%)")


def test_the_carried_tree_holds_every_dependency_pyproject_names():
    """The tree of run D's days lacked what extforge later came to need (packaging, uv, auditwheel):
    the wheel phase would have stopped at `auditwheel is not installed`."""
    names = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in carry.requirements()}
    assert {"uv", "auditwheel", "packaging", "py-rattler", "py-rattler-build", "pytest"} <= names
    assert phases.site_bundle("3.12") == "site312.tar.xz"
    assert "--python-version" in carry.target("3.12") and "--only-binary=:all:" in carry.target("3.12")
