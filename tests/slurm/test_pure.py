"""Pure parts of the Slurm support: config, variant narrowing, scripts, Slurm output parsers."""

from pathlib import Path

import pytest

from extforge.channel_ref import listing as channel_listing
from extforge.errors import ExtforgeError
from extforge.slurm.config import load, merge, parse_config
from extforge.slurm.matrix import Variant
from extforge.slurm.nodes import build_node_type, parse_sinfo
from extforge.slurm.script import (
    BuildJob,
    JobFiles,
    render_build_script,
    sbatch_options,
)
from extforge.slurm.state import (
    JobRecord,
    QueueEntry,
    classify,
    parse_sacct,
    parse_sbatch_parsable,
    parse_squeue,
    published_in,
)
from extforge.slurm.verify import rows_from_run, split_labelled

VARIANT = Variant(
    name="demo-ext", version="0.1.0", build_string="cuda130_torch214_py311_habc_0", subdir="linux-64",
    values=(("cuda_archs", "80;90"), ("python", "3.11")), outputs=("linux-64/demo-ext-0.1.0-cuda130_torch214_py311_habc_0",),
)


def job(resources=("--cpus-per-task=16", "--mem=120G", "--time=00:40:00")) -> BuildJob:
    return BuildJob(
        variant=VARIANT, recipe=Path("/r/demo-ext"), channels=("file:///mirror",), publish_to="/shared/ch",
        variant_files=(Path("/r/demo-ext/variants.yaml"),), files=JobFiles.under(Path("/o/slurm"), VARIANT.id),
        resources=resources, extforge=("/venv/bin/python", "-m", "extforge"), env=(("EXTFORGE_CACHE", "/shared/cache"),),
    )


def test_config_file_then_flags_win(tmp_path):
    f = tmp_path / "slurm.toml"
    f.write_text('partition = "gpu"\naccount = "proj"\nextra_args = ["--constraint=h100"]\nsetup = "module load cuda"\n')
    cfg = load(f, {"partition": "debug", "account": None, "extra_args": []})
    assert (cfg.partition, cfg.account, cfg.extra_args, cfg.setup) == ("debug", "proj", ("--constraint=h100",), ("module load cuda",))
    assert cfg.sources["partition"] == "flag" and cfg.sources["account"] == str(f)


def test_config_rejects_unknown_keys_and_missing_explicit_file(tmp_path):
    with pytest.raises(ExtforgeError, match="unknown settings: partiton"):
        parse_config('partiton = "gpu"', "slurm.toml")
    with pytest.raises(ExtforgeError, match="does not exist"):
        load(tmp_path / "nope.toml", {})
    assert parse_config('[slurm]\naccount = "a"', "x") == {"account": "a"}
    assert merge({}, {}, None).partition is None


def test_variant_id_args_and_archs():
    assert VARIANT.id == "demo-ext-0.1.0-cuda130_torch214_py311_habc_0"
    assert VARIANT.build_args == ["--variant", "cuda_archs=80;90", "--variant", "python=3.11"]
    assert VARIANT.archs() == ["80", "90"]


def test_sbatch_script_requests_resources_logs_and_publishes():
    from extforge.slurm.config import SlurmConfig

    cfg = SlurmConfig(partition="gpu", account="proj", extra_args=("--constraint=h100",), setup=("module load cuda/13.0",))
    text = render_build_script(job(), cfg)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    sb = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH")]
    assert sb == [
        f"--job-name=extforge:{VARIANT.id}", f"--output=/o/slurm/logs/{VARIANT.id}.log", "--nodes=1", "--ntasks=1",
        "--cpus-per-task=16", "--mem=120G", "--time=00:40:00", "--partition=gpu", "--account=proj", "--constraint=h100",
    ]
    build = next(line for line in lines if " build " in line)
    assert build.endswith(' 2> "$build_err" || rc=$?')
    assert build.removesuffix(' 2> "$build_err" || rc=$?').split() == [
        "/venv/bin/python", "-m", "extforge", "build", "/r/demo-ext", "--output-dir", f"/o/slurm/out/{VARIANT.id}",
        "--channel", "file:///mirror", "--variant-config", "/r/demo-ext/variants.yaml",
        "--variant", "'cuda_archs=80;90'", "--variant", "python=3.11",
    ]
    assert "export EXTFORGE_CACHE=/shared/cache" in lines and "module load cuda/13.0" in lines
    assert lines.index("module load cuda/13.0") < lines.index(build)
    assert any(" publish " in line and "--channel /shared/ch" in line for line in lines)
    assert f"exit_file=/o/slurm/exit/{VARIANT.id}.exit" in lines


def test_time_from_config_replaces_planner_time():
    from extforge.slurm.config import SlurmConfig

    opts = sbatch_options(job(), SlurmConfig(time="8:00:00"))
    assert "--time=8:00:00" in opts and "--time=00:40:00" not in opts


def test_script_runs_under_bash_and_records_failure(tmp_path):
    """The generated script itself: a failing build puts its build log tail in the job log and its exit status in the exit file."""
    import subprocess

    fake = tmp_path / "fake-extforge"
    # Like extforge build: rattler-build's output goes to a log under --output-dir ($4).
    fake.write_text('#!/bin/sh\n[ "$1" = build ] && mkdir -p "$4/logs" && echo "nvcc: Killed" > "$4/logs/b.log" && exit 7\nexit 0\n')
    fake.chmod(0o755)
    j = job()
    j = BuildJob(**{**j.__dict__, "files": JobFiles.under(tmp_path, VARIANT.id), "extforge": (str(fake),)})
    (tmp_path / "exit").mkdir()
    script = tmp_path / "job.sh"
    from extforge.slurm.config import SlurmConfig

    script.write_text(render_build_script(j, SlurmConfig()))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 7
    from extforge.slurm.submit import split_job_log

    assert split_job_log(proc.stdout)[0] == "nvcc: Killed\n"
    assert (tmp_path / "exit" / f"{VARIANT.id}.exit").read_text().strip() == "7"


def test_slurm_output_parsers():
    assert parse_sbatch_parsable("1234\n") == "1234"
    assert parse_sbatch_parsable("77;cluster2") == "77"
    with pytest.raises(ValueError):
        parse_sbatch_parsable("sbatch: error: invalid partition")
    q = parse_squeue("12|RUNNING|None|gpu01\n13|PENDING|Resources|\n")
    assert q["12"].state == "RUNNING" and q["13"].reason == "Resources"
    s = parse_sacct("12|CANCELLED by 0|0:15|gpu01\n13|OUT_OF_MEMORY|0:125|gpu02\n")
    assert (s["12"].state, s["13"].state, s["13"].exit_code) == ("CANCELLED", "OUT_OF_MEMORY", "0:125")
    nodes = parse_sinfo("gpu01|16|128000|idle\ngpu02|32|256000|mixed\ngpu03|16|128000|down*\ngpu01|16|128000|idle\n")
    assert [n.name for n in nodes] == ["gpu01", "gpu02", "gpu03"]
    assert [n.usable for n in nodes] == [True, True, False]
    m = build_node_type(nodes)
    assert (m.cores, m.memory_bytes) == (16, 128000 * 1024**2)


def test_classify_order_of_evidence():
    rec = JobRecord("v", "12", {}, ["noarch/v-1-0"], "/l", "/e", "/s", "t")
    assert classify(rec, "v", True, QueueEntry("12", "FAILED", "", ""), 3, None).state == "published"
    assert classify(None, "v", False, None, None, None).state == "not-submitted"
    assert classify(rec, "v", False, QueueEntry("12", "PENDING", "Priority", ""), None, None).state == "pending"
    assert classify(rec, "v", False, QueueEntry("12", "RUNNING", "None", "n1"), None, None).detail == "RUNNING on n1"
    assert classify(rec, "v", False, None, 0, None).state == "built"
    assert classify(rec, "v", False, QueueEntry("12", "FAILED", "NonZeroExitCode", "n1"), 1, None).detail == "exit code 1"
    timeout = classify(rec, "v", False, None, None, QueueEntry("12", "TIMEOUT", "", "n1", "0:0"))
    assert (timeout.state, timeout.detail) == ("failed", "Slurm state TIMEOUT")
    assert classify(rec, "v", False, None, None, None).state == "lost"


def test_verify_rows_from_labelled_srun_output():
    ok = '{"ok": true, "checks": [{"name": "files", "verdict": "pass", "summary": "3 files"}]}'
    bad = '{"ok": false, "checks": [{"name": "admission", "verdict": "fail", "summary": "GPU arch", "findings": ["sm_80 not compiled in"]}]}'
    stdout = "0: @node n1\n1: @node n2\n" + "".join(f"0: {line}\n" for line in ok.splitlines()) + f"1: {bad}\n0: @exit 0\n1: @exit 1\n"
    stderr = "1: some human output\nsrun: error: n3: task 2: Exited with exit code 1\n"
    tasks, messages = split_labelled(stdout, stderr)
    assert tasks[1].stderr == ["some human output"] and messages == ["srun: error: n3: task 2: Exited with exit code 1"]
    rows = rows_from_run(["n1", "n2", "n3"], stdout, stderr)
    assert [(r.node, r.verdict) for r in rows] == [("n1", "pass"), ("n2", "fail"), ("n3", "error")]
    assert rows[1].reasons == ["admission: GPU arch", "  sm_80 not compiled in"]


def test_job_log_split_into_build_output_and_error():
    from extforge.slurm.script import BUILD_LOG_MARK, ERROR_MARK
    from extforge.slurm.submit import split_job_log

    log = f"start\n{BUILD_LOG_MARK} /o/logs/b.log:\ninfo: Killed\n{ERROR_MARK} 2:\nerror: building failed\n  why: long\n"
    assert split_job_log(log) == ("info: Killed\n", "error: building failed\n  why: long")
    assert split_job_log("plain\nlog\n") == ("plain\nlog\n", "")


def test_published_means_listed_in_the_index_not_just_copied_in(tmp_path):
    """publish copies a package in before it re-indexes; a waiter told "published" installs next."""
    import json

    sub = tmp_path / "linux-64"
    sub.mkdir()
    outputs = ["linux-64/demo-ext-0.1-h1_0", "linux-64/demo-ext-0.1-h2_0"]
    for o in outputs:
        (tmp_path / f"{o}.conda").write_bytes(b"")
    def record(build: str) -> dict:
        return {"name": "demo-ext", "version": "0.1", "build": build}

    (sub / "repodata.json").write_text(json.dumps({"packages.conda": {"demo-ext-0.1-h1_0.conda": record("h1_0")}}))
    assert not published_in(channel_listing(tmp_path, {"linux-64"}), outputs)
    (sub / "repodata.json").write_text(json.dumps({"packages.conda": {"demo-ext-0.1-h1_0.conda": record("h1_0")},
                                                   "packages": {"demo-ext-0.1-h2_0.tar.bz2": record("h2_0")}}))
    assert published_in(channel_listing(tmp_path, {"linux-64"}), outputs)
    assert not published_in(channel_listing(tmp_path / "nowhere", {"linux-64"}), outputs)
    assert not published_in(channel_listing(None, {"linux-64"}), outputs)


def test_a_slurm_job_builds_with_the_options_a_local_build_gets(tmp_path):
    """One BuildOptions feeds both paths: a job's `extforge build` line carries its test/audit choice."""
    from extforge.building.build_options import BuildOptions
    from extforge.machine import Machine
    from extforge.slurm.config import SlurmConfig
    from extforge.slurm.submit import BuildRequest, make_job

    opts = BuildOptions.make(tmp_path / "recipe", [str(tmp_path)], tmp_path / "out",
                             variants={"python": ["3.11"]}, test=False, audit=False)
    with pytest.raises(AttributeError):
        opts.test = True  # type: ignore[misc]
    req = BuildRequest(opts, str(tmp_path / "published"), SlurmConfig())
    job = make_job(req, VARIANT, [str(tmp_path)], Machine(16, 128 * 2**30, "2.39", "test", "test"))
    assert job.build_flags == ("--no-test", "--no-audit") and job.publish_flags == ("--no-audit",)
    assert job.recipe == opts.recipe.resolve() and req.root == opts.output_dir / "slurm"
    assert opts.variants == {"python": ["3.11"]}
    audited = make_job(BuildRequest(BuildOptions.make(tmp_path, [], tmp_path), "x", SlurmConfig()), VARIANT, [],
                       Machine(16, 128 * 2**30, "2.39", "test", "test"))
    assert audited.build_flags == () and audited.publish_flags == ()


def test_a_split_build_is_a_job_array_of_parts_then_a_link_job_that_publishes(tmp_path):
    """--parts 3: task I of the array runs `extforge build --part I/3` into a folder of its own and
    publishes nothing; the variant's job waits for the whole array (afterany: a failed part only
    leaves units to compile) and builds with --link-parts 3, then publishes."""
    import subprocess
    from dataclasses import replace

    from extforge.slurm.config import SlurmConfig
    from extforge.slurm.script import render_parts_script

    fake = tmp_path / "fake-extforge"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv.$SLURM_ARRAY_TASK_ID"\n')
    fake.chmod(0o755)
    j = replace(job(), parts=3, extforge=(str(fake),), files=JobFiles.under(tmp_path, VARIANT.id))
    parts = render_parts_script(j, SlurmConfig(partition="gpu"))
    sb = [line.removeprefix("#SBATCH ") for line in parts.splitlines() if line.startswith("#SBATCH")]
    assert sb[:3] == [f"--job-name=extforge:{VARIANT.id}:parts", f"--output={tmp_path}/logs/{VARIANT.id}.part-%a.log",
                      "--array=1-3"]
    assert "--partition=gpu" in sb and "--cpus-per-task=16" in sb and " publish " not in parts
    script = tmp_path / "parts.sh"
    script.write_text(parts)
    subprocess.run(["bash", str(script)], check=True, env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "2"})
    argv = (tmp_path / "argv.2").read_text().split()
    assert argv[argv.index("--output-dir") + 1] == f"{tmp_path}/out/{VARIANT.id}.parts/2"
    assert argv[-2:] == ["--part", "2/3"]

    link = render_build_script(replace(j, after_job="4711"), SlurmConfig())
    assert "#SBATCH --dependency=afterany:4711" in link.splitlines()
    build = next(line for line in link.splitlines() if " build " in line)
    assert "--link-parts 3" in build and " publish " in link
    assert "--dependency" not in render_build_script(job(), SlurmConfig())


def test_a_slurm_job_asked_for_wheels_publishes_the_wheel_first_then_the_package(tmp_path, monkeypatch):
    """`--slurm --publish-to CH --wheels DIR`, the option of `extforge publish --wheels`: each job
    publishes its package's wheel into DIR (with the build's --manylinux target), then the package
    into CH; a wheel refused fails the job before the channel lists the package. The old code had
    no --wheels with --slurm (argparse refused it): a site building on Slurm got no wheels."""
    import subprocess
    from dataclasses import replace

    from extforge.cli import build_parser
    from extforge.commands.build import options_from_args
    from extforge.machine import Machine
    from extforge.slurm.cli import build_request
    from extforge.slurm.config import SlurmConfig
    from extforge.slurm.submit import make_job

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["build", str(tmp_path / "recipe"), "-c", str(tmp_path), "--slurm", "--publish-to", "ch",
                                      "--wheels", "wheels", "--manylinux", "2_28"])
    req = build_request(options_from_args(args), args)
    assert req.wheels == tmp_path / "wheels" and req.publish_to == str(tmp_path / "ch")
    made = make_job(req, VARIANT, [str(tmp_path)], Machine(16, 128 * 2**30, "2.39", "test", "test"))
    assert made.wheel_publish == ("--wheels", str(tmp_path / "wheels"), "--manylinux", "2_28")

    # The generated script, run by bash with an extforge that records each call; its build leaves the package.
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-extforge"
    fake.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
                    f'[ "$1" = build ] && mkdir -p "$4/linux-64" && touch "$4/{VARIANT.outputs[0]}.conda"\n'
                    'case "$*" in *--wheels*) exit "${WHEEL_RC:-0}";; esac\nexit 0\n')
    fake.chmod(0o755)
    (tmp_path / "exit").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(render_build_script(replace(made, extforge=(str(fake),), files=JobFiles.under(tmp_path, VARIANT.id)),
                                          SlurmConfig()))
    package = f"{tmp_path}/out/{VARIANT.id}/{VARIANT.outputs[0]}.conda"
    subprocess.run(["bash", str(script)], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    build, wheel, channel = calls.read_text().splitlines()
    assert build.startswith("build ") and "--manylinux 2_28" in build
    assert wheel.split() == ["publish", package, "--wheels", str(tmp_path / "wheels"), "--manylinux", "2_28",
                             "--upstream", str(tmp_path)]
    assert channel.split() == ["publish", package, "--channel", str(tmp_path / "ch"), "--upstream", str(tmp_path)]

    calls.unlink()
    proc = subprocess.run(["bash", str(script)], capture_output=True, env={"PATH": "/usr/bin:/bin", "WHEEL_RC": "1"})
    assert proc.returncode == 1 and [c.split()[0] for c in calls.read_text().splitlines()] == ["build", "publish"]
    assert (tmp_path / "exit" / f"{VARIANT.id}.exit").read_text().strip() == "1"
    assert " --wheels " not in render_build_script(job(), SlurmConfig())


def test_wheels_without_slurm_is_refused_naming_the_local_way():
    """A local build publishes nothing: --wheels DIR there would be ignored without a word."""
    from cli_run import run_extforge

    proc = run_extforge("build", "recipe", "-c", "/nowhere", "--wheels", "/tmp/nowhere-wheels", timeout=120)
    assert proc.returncode == 2 and "--wheels DIR is the wheel index the Slurm jobs publish to" in proc.stderr
    assert "extforge publish PKG --wheels DIR" in proc.stderr
