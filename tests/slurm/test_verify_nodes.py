"""`extforge verify PREFIX --slurm`: verify runs on every node through srun, one row per node."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extforge.environment.receipt import Pinned, Receipt, write_receipt

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def installed_prefix(tmp_path_factory) -> Path:
    """A real conda prefix: the tiny test package built by rattler-build, installed by rattler."""
    import rattler
    from rattler_build import Stage0Recipe, VariantConfig

    work = tmp_path_factory.mktemp("verify-prefix")
    empty = work / "empty"
    (empty / "noarch").mkdir(parents=True)
    out = work / "out"
    Stage0Recipe.from_file(DATA / "tinyvar" / "recipe.yaml").run_build(
        variant_config=VariantConfig({"cuda_archs": ["90"]}), output_dir=out, channels=[empty.as_uri()]
    )
    records = asyncio.run(rattler.solve([out.as_uri()], ["slurm-tinyvar"], platforms=["linux-64", "noarch"]))
    prefix = work / "env"
    asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=work / "pkgs", show_progress=False))
    # What `extforge install` leaves beside the prefix: verify without --lock believes nothing else.
    write_receipt(Receipt(str(prefix.resolve()), "(solved by the test)", "default", [Pinned.from_record(r) for r in records]))
    return prefix


def verify(prefix: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extforge", "verify", str(prefix), "--slurm", "--partition", "debug", "--json", *extra],
        capture_output=True, text=True, env=os.environ, timeout=180,
    )


@pytest.mark.slurm
def test_verify_on_every_node_passes_then_reports_drift(slurm_cluster, installed_prefix):
    proc = verify(installed_prefix)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["nodes"]
    assert [(r["node"], r["verdict"]) for r in rows] == [(slurm_cluster.node, "pass")]
    assert rows[0]["report"]["prefix"] == str(installed_prefix.resolve())

    # Drift in the shared prefix: a file edited after install.
    archs = installed_prefix / "share" / "slurm-tinyvar" / "archs"
    archs.write_text("80\n")
    proc = verify(installed_prefix)
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)["nodes"]
    assert row["verdict"] == "fail"
    assert row["reasons"][0].startswith("files:")
    assert any("modified: share/slurm-tinyvar/archs" in r for r in row["reasons"])
