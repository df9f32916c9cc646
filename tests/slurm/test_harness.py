"""The local Slurm itself runs jobs: the ground the other Slurm tests stand on."""

import subprocess

import pytest

from extforge.slurm.state import parse_sbatch_parsable, query_squeue


@pytest.mark.slurm
def test_sbatch_runs_a_job_and_squeue_reports_its_end(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    proc = subprocess.run(
        ["sbatch", "--parsable", "-c", "1", "--mem=50M", "-t", "1", f"--output={out}", "--wrap", "echo ran-on-$SLURMD_NODENAME; exit 3"],
        capture_output=True, text=True, check=True,
    )
    job_id = parse_sbatch_parsable(proc.stdout)
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        entry = query_squeue([job_id]).get(job_id)
        if entry and entry.state not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
            break
        time.sleep(0.5)
    assert entry is not None and entry.state == "FAILED"
    assert out.read_text().strip() == f"ran-on-{slurm_cluster.node}"
