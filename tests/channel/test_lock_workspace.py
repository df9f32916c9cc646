"""Locks as pixi keeps them: `lock --env a` keeps the other environments, lock runs on one
workspace serialize, environment names stay names, and nothing is written through a symlink
planted in the workspace or envs/."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ruamel.yaml import YAML

from cli_run import EXTFORGE
from extforge.environment.lock import lock, run_lock_path, stale_reasons
from extforge.environment.manifest import read_manifest
from extforge.locking import exclusive
from extforge.publishing.publish import publish

MANIFEST = """\
[workspace]
name = "t"
channels = ["{channel}"]
platforms = [{{ platform = "linux-64", cuda = "13.0" }}]

[feature.a.dependencies]
tiny-app = "{app}"

[feature.b.dependencies]
tiny-05 = "*"

[environments]
{a} = {{ features = ["a"], no-default-feature = true }}
b = {{ features = ["b"], no-default-feature = true }}
"""


def _workspace(tmp_path: Path, tiny_packages, *, a: str = "a", app: str = "*") -> Path:
    channel = tmp_path / "ch"
    if not channel.exists():
        publish(tiny_packages.distinct[:6] + [tiny_packages.app], channel, audit=False)
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "pixi.toml").write_text(MANIFEST.format(channel=channel.as_uri(), a=a, app=app))
    return ws


def _env_packages(lock_path: Path) -> dict[str, list[str]]:
    doc = YAML(typ="safe").load(lock_path.read_text())
    return {name: sorted(p["conda"] for p in env["packages"].get("linux-64", [])) for name, env in doc["environments"].items()}


def _lock_cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EXTFORGE, "lock", "--manifest", str(ws / "pixi.toml"), *args], capture_output=True, text=True)


def test_lock_one_env_keeps_the_others(tiny_packages, tmp_path):
    ws = _workspace(tmp_path, tiny_packages)
    lock(read_manifest(ws / "pixi.toml"), ws / "pixi.lock")
    before = _env_packages(ws / "pixi.lock")
    b_exports = {p.name: p.read_bytes() for p in (ws / "envs").glob("b.*")}
    assert set(before) == {"default", "a", "b"} and before["default"] == [] and any("tiny-05" in u for u in before["b"])

    _workspace(tmp_path, tiny_packages, app=">=1.0")  # a changes
    proc = _lock_cli(ws, "--env", "a")
    assert proc.returncode == 0, proc.stderr
    assert _env_packages(ws / "pixi.lock") == before
    assert {p.name: p.read_bytes() for p in (ws / "envs").glob("b.*")} == b_exports
    assert stale_reasons(read_manifest(ws / "pixi.toml"), ws / "pixi.lock") == []
    proc = subprocess.run([*EXTFORGE, "install", "b", "--prefix", str(tmp_path / "b"), "--lock", str(ws / "pixi.lock")],
                          capture_output=True, text=True, env={**os.environ, "EXTFORGE_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b" / "share" / "tiny-05" / "data.txt").is_file()


def test_a_first_lock_of_one_env_holds_pixis_default_too(tiny_packages, tmp_path):
    """pixi writes `default` into every lock; with an empty default feature it costs no solve."""
    ws = _workspace(tmp_path, tiny_packages)
    proc = _lock_cli(ws, "--env", "b")
    assert proc.returncode == 0, proc.stderr
    locked = _env_packages(ws / "pixi.lock")
    assert set(locked) == {"default", "b"} and locked["default"] == []


def test_the_environment_yml_of_an_empty_environment_lists_no_dependencies(tiny_packages, tmp_path):
    """pixi's `default` of a workspace whose features are all named is empty; its
    environment.yml said `dependencies:` with nothing after it, a null that conda 26.7 warns it
    will reject (and conda's next release rejects)."""
    ws = _workspace(tmp_path, tiny_packages)
    proc = _lock_cli(ws)
    assert proc.returncode == 0, proc.stderr
    empty = YAML(typ="safe").load((ws / "envs" / "default.environment.yml").read_text())
    assert empty["dependencies"] == [] and empty["channels"] == [(tmp_path / "ch").as_uri()]
    full = YAML(typ="safe").load((ws / "envs" / "b.environment.yml").read_text())
    assert [d.split("=")[0] for d in full["dependencies"]] == ["tiny-05"]


def test_concurrent_lock_runs_serialize(tiny_packages, tmp_path):
    ws = _workspace(tmp_path, tiny_packages)
    runs = [subprocess.Popen([*EXTFORGE, "lock", "--manifest", str(ws / "pixi.toml"), *(["--env", "b"] if i % 2 else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    assert set(_env_packages(ws / "pixi.lock")) == {"default", "a", "b"}
    assert _lock_cli(ws, "--check").returncode == 0
    assert [p.name for p in ws.rglob("*.tmp")] == []
    # A run waits while another holds the workspace's lock, then goes on.
    with exclusive(run_lock_path(ws / "pixi.lock"), transient=True):
        waiting = subprocess.Popen([*EXTFORGE, "lock", "--manifest", str(ws / "pixi.toml")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        assert waiting.poll() is None
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err


def test_environment_names_are_names(tiny_packages, tmp_path):
    for bad in ("../../escaped", "/tmp/abs", "Upper_case"):
        ws = _workspace(tmp_path, tiny_packages, a=f'"{bad}"')
        proc = _lock_cli(ws)
        assert proc.returncode == 2, proc.stderr
        said = " ".join(proc.stderr.split())  # the console wraps long lines
        assert f"environment name {bad!r}" in said and "unexpectedly" not in said
        assert not (ws / "envs").exists() and not (ws / "pixi.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ch", "ws"]


def test_lock_never_writes_through_planted_symlinks(tiny_packages, tmp_path):
    ws = _workspace(tmp_path, tiny_packages)
    victims = {}
    (ws / "envs").mkdir()
    for name in ("pixi.lock", "pixi.lock.tmp", "envs/a.explicit.txt", "envs/a.environment.yml.tmp", "envs/lock-inputs.json"):
        victim = tmp_path / f"victim-{len(victims)}"
        victim.write_text("precious\n")
        (ws / name).symlink_to(victim)
        victims[victim] = name
    proc = _lock_cli(ws)
    assert proc.returncode == 0, proc.stderr
    assert all(v.read_text() == "precious\n" for v in victims)
    for name in ("pixi.lock", "envs/a.explicit.txt", "envs/lock-inputs.json"):
        assert not (ws / name).is_symlink() and (ws / name).is_file(), name
    assert _lock_cli(ws, "--check").returncode == 0


def test_an_envs_folder_that_is_a_symlink_is_refused(tiny_packages, tmp_path):
    ws = _workspace(tmp_path, tiny_packages)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / "envs").symlink_to(elsewhere)
    proc = _lock_cli(ws)
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert proc.returncode == 2 and "envs: it is not a folder" in said, proc.stderr
    assert list(elsewhere.iterdir()) == [] and not (ws / "pixi.lock").exists()
