"""The sbatch request of a flash-attn variant is exactly what `extforge plan` computes."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import run_extforge

REPO = Path(__file__).resolve().parents[2]


def extforge(*args: str) -> str:
    proc = run_extforge(*args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_flash_attn_sbatch_matches_plan_on_a_16_core_128g_node(tmp_path):
    channel = tmp_path / "channel"
    channel.mkdir()
    doc = json.loads(extforge(
        "build", str(REPO / "recipe" / "flash-attn"), "--slurm", "--dry-run", "--json",
        "--node-cores", "16", "--node-memory", "128G", "--channel", str(channel),
        "--variant-config", str(REPO / "recipe" / "flash-attn" / "variants-offline.yaml"),
        "--output-dir", str(tmp_path / "out"), "--publish-to", str(tmp_path / "published"),
    ))
    scripts = doc["scripts"]
    # One job per row of the offline variant file: the development machine and the H100 node
    # (CUDA 13.0), clusters A, B and C (CUDA 12.4).
    assert len(scripts) == 5
    seen_archs = set()
    for text in scripts.values():
        archs = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("#   cuda_archs"))
        archs = archs.strip().replace(";", ",")
        seen_archs.add(archs)
        plan = json.loads(extforge("plan", str(REPO / "recipe" / "flash-attn"), "--cores", "16", "--memory", "128G",
                                   "--archs", archs, "--json"))
        requested = [line.removeprefix("#SBATCH ") for line in text.splitlines()
                     if line.startswith(("#SBATCH --cpus-per-task", "#SBATCH --mem", "#SBATCH --time"))]
        assert requested == plan["slurm"]["sbatch_args"], archs
        assert "--profile flash-attn" in text
    assert seen_archs == {"8.0,9.0", "9.0", "8.0"}
    assert not (tmp_path / "out").exists(), "a dry run writes nothing"
