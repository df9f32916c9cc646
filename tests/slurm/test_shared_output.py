"""`extforge build --slurm` and `extforge status` where another user can write the output folder
(a group's 2775 folder on shared storage): the state file, the job logs and exit files it names,
and the folders each job writes into by name, planted by a real other user (tests/peers.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_run import run_extforge
from peers import PeerSite, peer_site  # noqa: F401  (the multi-user fixture, shared with other areas)

DATA = Path(__file__).parent / "data"
pytestmark = [pytest.mark.slurm]
SECRET = "root-only-line-7f3a"


def _as_peer(site: PeerSite, code: str) -> None:
    """Python `code` run as the first peer (umask 002, as a group's members set it)."""
    peer = site.peers[0]
    subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--",
                    site.python, "-c", f"import os; os.umask(0o002); {code}"], check=True, cwd=site.root)


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    secret.chmod(0o600)
    return secret


def test_status_reads_only_the_jobs_own_files_whatever_a_planted_state_names(
        peer_site: PeerSite, slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    """A member plants slurm/state.json in a shared output folder naming a failed job whose log is
    a file only root may read, and root runs `extforge status OUT`. main took the log's path from
    the state file and printed its last lines (root's secret, shown to whoever reads the output);
    a state file nested 100,000 deep was "failed unexpectedly: RecursionError". Now the state is
    read typed and bounded by the one reader, each job's files are its variant's below slurm/
    (a link planted there is not followed), and a malformed state is one line, exit 2."""
    site = peer_site
    out = site.shared_folder("out-status")
    secret = _secret(tmp_path)
    vid = "slurm-failing-0.1.0-h0000000_0"
    state = {"schema": 1, "recipe": "/r/recipe.yaml", "channel": str(site.root / "nowhere"),
             "jobs": {vid: {"variant_id": vid, "job_id": "987654", "values": {}, "outputs": [f"noarch/{vid}"],
                            "log": str(secret), "exit_file": str(out / "exit-1"), "script": "/s",
                            "submitted": "2026-12-05T00:00:00+00:00"}}}
    _as_peer(site, f"""
import json
os.makedirs('{out}/slurm/exit'); os.makedirs('{out}/slurm/logs')
open('{out}/exit-1', 'w').write('1\\n'); open('{out}/slurm/exit/{vid}.exit', 'w').write('1\\n')
os.symlink('{secret}', '{out}/slurm/logs/{vid}.log')
open('{out}/slurm/state.json', 'w').write({json.dumps(json.dumps(state))})
""")
    proc = run_extforge("status", str(out), "--json", timeout=120)
    assert SECRET not in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)["variants"]
    assert row["state"] == "failed" and row["log"] == f"{out}/slurm/logs/{vid}.log"
    assert "the job log was not read: it is a symbolic link" in row["log_tail"]

    _as_peer(site, f"open('{out}/slurm/state.json', 'w').write('[' * 100_000)")
    deep = run_extforge("status", str(out), timeout=120)
    assert deep.returncode == 2 and "failed unexpectedly" not in deep.stderr
    assert "the Slurm state file" in deep.stderr and "nested more than" in deep.stderr


def test_jobs_never_write_into_folders_another_user_can_replace(
        peer_site: PeerSite, slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    """A member of the output folder's group (2775) makes slurm/exit/ there and links the name the
    job's exit trap writes first (`<variant>.exit.tmp`) to a file of root's. main made the job's
    folders with make_dirs, taking the member's, and root's job wrote its exit status through the
    link (root's file became "1"). Now the jobs' folders (scripts, logs, exit, out) are the
    submitter's own (0755) in an output folder nobody else can write or rename them out of: the
    submit is refused with the fix, nothing is submitted, the file is as it was."""
    site = peer_site
    out, channel, upstream = site.shared_folder("out-jobs"), tmp_path / "channel", tmp_path / "upstream"
    for sub in ("noarch", "linux-64"):
        (upstream / sub).mkdir(parents=True)
        (upstream / sub / "repodata.json").write_text(json.dumps({"info": {"subdir": sub}, "packages": {}}))
    args = ["build", str(DATA / "failing"), "--slurm", "--partition", "debug", "--channel", upstream.as_uri(),
            "--output-dir", str(out), "--publish-to", str(channel), "--json", "--no-audit"]
    dry = run_extforge(*args, "--dry-run", timeout=300)
    assert dry.returncode == 0, dry.stderr
    (vid,) = json.loads(dry.stdout)["scripts"]
    victim = _secret(tmp_path)
    _as_peer(site, f"os.makedirs('{out}/slurm/exit'); os.symlink('{victim}', '{out}/slurm/exit/{vid}.exit.tmp')")

    proc = run_extforge(*args, "--wait", "300", timeout=400)
    assert victim.read_text() == f"{SECRET}\n"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"cannot submit jobs from {out}: others may write it" in proc.stderr
    assert not os.path.lexists(out / "slurm" / "state.json")


def test_a_recipe_a_member_can_write_is_refused_before_any_job_is_queued(
        peer_site: PeerSite, slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    """root submits a recipe kept in a group's folder (2775, umask 002: its recipe.yaml 664), whose
    `script:` a member can rewrite until the job runs it as root on a node. main queued the job
    (its state.json written). Now the submit is refused before anything is queued (exit 2),
    naming the folder and the members who may write it."""
    site = peer_site
    recipe = site.shared_folder("recipe-slurm")
    old = os.umask(0o002)
    try:
        (recipe / "recipe.yaml").write_text((DATA / "failing" / "recipe.yaml").read_text())
    finally:
        os.umask(old)
    out, upstream = tmp_path / "out", tmp_path / "upstream"
    for sub in ("noarch", "linux-64"):
        (upstream / sub).mkdir(parents=True)
        (upstream / sub / "repodata.json").write_text(json.dumps({"info": {"subdir": sub}, "packages": {}}))
    proc = run_extforge("build", str(recipe), "--slurm", "--partition", "debug", "--channel", upstream.as_uri(),
                        "--output-dir", str(out), "--publish-to", str(tmp_path / "channel"), "--json", "--no-audit",
                        timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"refusing to run the recipe {recipe}: {recipe}: the members of its group may write it" in proc.stderr
    assert "extforge-peer, extforge-peer2" in proc.stderr
    assert not os.path.lexists(out / "slurm" / "state.json")
