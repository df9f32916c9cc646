"""`extforge build --slurm` against the local slurmctld: real jobs, real builds, a real channel."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_run import run_extforge

DATA = Path(__file__).parent / "data"
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def extforge(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_extforge(*args, timeout=timeout)


@pytest.fixture(scope="module")
def empty_channel(tmp_path_factory) -> Path:
    """The noarch test recipes need nothing from upstream; rattler-build still wants a channel."""
    ch = tmp_path_factory.mktemp("upstream")
    for sub in ("noarch", "linux-64"):
        (ch / sub).mkdir()
        (ch / sub / "repodata.json").write_text(json.dumps({"info": {"subdir": sub}, "packages": {}, "packages.conda": {}}))
    return ch


def build_slurm(recipe: Path, channel: Path, out: Path, publish: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return extforge(
        "build", str(recipe), "--slurm", "--partition", "debug", "--channel", channel.as_uri(),
        "--output-dir", str(out), "--publish-to", str(publish), "--json",
        # The audit judges torch extensions; these test packages have no torch to audit against.
        "--no-audit", *extra,
    )


def test_variant_matrix_built_as_jobs_and_published(slurm_cluster, empty_channel, tmp_path):
    out, channel = tmp_path / "out", tmp_path / "channel"
    proc = build_slurm(DATA / "tinyvar", empty_channel, out, channel, "--wait", "400")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert len(doc["submitted"]) == 2 and len({s["job_id"] for s in doc["submitted"]}) == 2
    assert sorted(r["state"] for r in doc["variants"]) == ["published", "published"]

    files = sorted(p.name for p in (channel / "noarch").glob("slurm-tinyvar-*.conda"))
    assert [f.split("-")[3].split("_h")[0] for f in files] == ["sm80", "sm90"]
    repodata = json.loads((channel / "noarch" / "repodata.json").read_text())
    assert sorted(repodata["packages.conda"]) == files
    for r in doc["submitted"]:
        log = Path(r["log"]).read_text()
        assert f"job {r['job_id']} on" in log and "published 1 package(s)" in log

    # Re-running submits only what is missing: nothing.
    again = build_slurm(DATA / "tinyvar", empty_channel, out, channel)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["submitted"] == [] and sorted(s["state"] for s in doc["skipped"]) == ["published", "published"]

    status = extforge("status", str(out), "--json")
    assert status.returncode == 0, status.stderr
    assert [v["state"] for v in json.loads(status.stdout)["variants"]] == ["published", "published"]


def test_failing_variant_reported_with_log_tail_and_diagnosis(slurm_cluster, empty_channel, tmp_path):
    out, channel = tmp_path / "out", tmp_path / "channel"
    proc = build_slurm(DATA / "failing", empty_channel, out, channel, "--wait", "300")
    assert proc.returncode == 1, proc.stderr + proc.stdout
    (row,) = json.loads(proc.stdout)["variants"]
    assert row["state"] == "failed" and row["detail"].startswith("exit code ")
    assert "ninja: build stopped: subcommand failed." in row["log_tail"]
    assert row["diagnosis"]["recognised"]
    assert {d["id"] for d in row["diagnosis"]["diagnoses"]} & {"ninja-build-stopped", "oom-killed"}
    assert not (channel / "noarch").exists() or not list((channel / "noarch").glob("*.conda"))

    status = extforge("status", str(out))
    assert status.returncode == 1
    assert "failed" in status.stderr and "diagnosis" in status.stderr


def test_demo_extension_arch_matrix_built_through_slurm_and_published(slurm_cluster, mirror_channel, tmp_path):
    """recipe/demo-ext for sm_80 and sm_90: two real CUDA compiles, two jobs, two audited packages."""
    out, channel = tmp_path / "out", tmp_path / "channel"
    proc = extforge(
        "build", str(Path(__file__).resolve().parents[2] / "recipe" / "demo-ext"), "--slurm", "--partition", "debug",
        "--channel", str(mirror_channel), "--variant", "cuda_archs=8.0,9.0", "--no-test",
        "--output-dir", str(out), "--publish-to", str(channel), "--json", "--wait", "1500",
        # The planner's time fits a quiet node; CI's two cores are shared with other work.
        "--time", "0:45:00",
        timeout=1600,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert sorted(r["state"] for r in doc["variants"]) == ["published", "published"]
    assert sorted(dict(s["values"])["cuda_archs"] for s in doc["submitted"]) == ["8.0", "9.0"]
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())
    names = sorted(repodata["packages.conda"])
    assert len(names) == 2 and all(n.startswith("demo-ext-") for n in names)
    for record in repodata["packages.conda"].values():
        assert any(d.startswith("pytorch ==") for d in record["depends"])


def test_a_split_build_runs_as_a_job_array_then_a_link_job_that_publishes(slurm_cluster, empty_channel, tmp_path, ccache):
    """--parts 2: an array of two part jobs compiles the recipe's four units into the shared compile
    cache, the link job (afterany on the array) builds the package from it and publishes it."""
    out, channel = tmp_path / "out", tmp_path / "channel"
    recipe = Path(__file__).parents[1] / "data" / "split-demo"
    proc = build_slurm(recipe, empty_channel, out, channel, "--parts", "2", "--shared-cache", str(tmp_path / "cache"),
                       "--wait", "400")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert [r["state"] for r in doc["variants"]] == ["published"]
    assert len(list((channel / "noarch").glob("split-demo-1.0.0-*.conda"))) == 1
    (vid,) = [r["variant_id"] for r in doc["submitted"]]
    logs = out / "slurm" / "logs"
    compiled = 0
    for i in (1, 2):
        part = (logs / f"{vid}.part-{i}.log").read_text()
        assert f"part {i}/2" in part and f"part {i} of 2: " in part, part
        compiled += int(part.split(f"part {i} of 2: ")[1].split()[0])
    assert compiled == 4
    link = (logs / f"{vid}.log").read_text()
    assert "the link job of 2 parts: 4 units (4 from the compile cache, 0 compiled here" in link, link
    # The parts published nothing: the channel holds the link job's package alone.
    assert not list((out / "slurm" / "out").glob(f"{vid}.parts/*/noarch/*.conda"))
