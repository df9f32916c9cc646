"""Install into the prefixes of a shared site: a team's pre-created prefix inside a folder only
root can write (installed by a real other user), a path with a space, a path too long for the
packages' placeholder, symbolic-link prefixes, and what a killed install leaves behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from extforge.environment.install import WORK

from .pyish import PLACEHOLDER, pyish_package


def _locked(sandbox) -> Path:
    channel = sandbox.path("ch")
    pyish_package(channel)
    return sandbox.lock(channel, "pyish")


def test_a_team_prefix_in_a_root_owned_folder_installs_as_its_owner(peer_site):
    # The site's layout: /nfs/envs is root's (0755), /nfs/envs/team-x was made for the team.
    channel = peer_site.root / "ch"
    pyish_package(channel)
    ws = peer_site.root / "ws"
    ws.mkdir()
    (ws / "pixi.toml").write_text('[workspace]\nname = "t"\nchannels = ["internal"]\nplatforms = ["linux-64"]\n\n'
                                  '[dependencies]\npyish = "*"\n')
    (ws / ".pixi").mkdir()
    (ws / ".pixi" / "config.toml").write_text(f'[mirrors]\n"https://conda.anaconda.org/internal" = ["{channel.as_uri()}"]\n')
    locked = subprocess.run([sys.executable, "-m", "extforge", "lock", "--manifest", str(ws / "pixi.toml")],
                            capture_output=True, text=True, env={**os.environ, "EXTFORGE_CACHE": str(peer_site.root / "rootcache")})
    assert locked.returncode == 0, locked.stderr
    envs = peer_site.root / "envs"
    envs.mkdir(mode=0o755)
    team = envs / "team x"  # a space too: the site's names are not ours to choose
    team.mkdir()
    user = peer_site.peers[0]
    os.chown(team, user.uid, peer_site.gid)
    os.chmod(team, 0o2750)
    res = peer_site.run(user, "install", "default", "--prefix", str(team), "--lock", str(ws / "pixi.lock"), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["cache_mismatches"] == []  # no false alarm, no cache entry dropped
    assert sorted(p.name for p in envs.iterdir()) == ["team x"]  # nothing beside the prefix
    assert (team / "lib" / "libpyish.so").stat().st_uid == user.uid
    assert (team / "lib" / "libpyish.so").stat().st_gid == peer_site.gid
    assert not (team / WORK).exists()  # no lock file, no staging left
    res = peer_site.run(user, "verify", str(team), "--env", "default", "--lock", str(ws / "pixi.lock"))
    assert res.returncode == 0, res.stdout + res.stderr
    # A user who may not write the prefix is told so in one line, and nothing changes.
    res = peer_site.run(peer_site.peers[1], "install", "default", "--prefix", str(envs / "new"), "--lock", str(ws / "pixi.lock"))
    assert res.returncode == 2 and "cannot create" in res.stderr and "Permission denied" in res.stderr, res.stderr
    assert sorted(p.name for p in envs.iterdir()) == ["team x"]


def test_a_prefix_with_a_space_installs_and_verifies_with_no_cache_purge(sandbox):
    lock = _locked(sandbox)
    prefix = sandbox.root / "with space" / "e"
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--json", expect=0)
    assert json.loads(res.stdout)["cache_mismatches"] == []
    # rattler runs a python script through /bin/sh when its interpreter's path holds a space.
    assert (prefix / "bin" / "pyish").read_text().startswith(f"#!/bin/sh\n'''exec' \"{prefix}/bin/python3.11\"")
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=0)


def test_a_prefix_too_long_for_the_placeholder_names_the_limit(sandbox):
    lock = _locked(sandbox)
    base = sandbox.root / "deep"
    prefix = base / ("x" * (len(PLACEHOLDER) - len(str(base))))  # one character over
    assert len(str(prefix)) == len(PLACEHOLDER) + 1
    with sandbox.unchanged_outside():
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=2)
    res.refused(f"is {len(PLACEHOLDER) + 1} characters long; these packages allow at most {len(PLACEHOLDER)}",
                "lib/libpyish.so", "install into a shorter path")
    assert "unexpectedly" not in res.output


def test_dangling_and_looping_symlink_prefixes_are_refused(sandbox):
    lock = _locked(sandbox)
    links = sandbox.cache / "links"  # out of the watched tree, which a loop would break
    links.mkdir()
    dangling = links / "dangling"
    dangling.symlink_to(sandbox.root / "elsewhere" / "env")
    loop = links / "loop"
    loop.symlink_to(loop)
    with sandbox.unchanged_outside():
        for link in (dangling, loop):
            res = sandbox.run("install", "default", "--prefix", str(link), "--lock", str(lock), "--json", expect=2)
            res.refused(f"prefix {link} is a symbolic link to", "does not exist or loops")
            assert json.loads(res.stdout)["error"].startswith(f"prefix {link}")
        res = sandbox.run("install", "default", "--prefix", str(loop / "sub"), "--lock", str(lock), expect=2)
        res.refused("cannot be resolved")


def test_a_real_sigkill_mid_install_is_cleaned_up_by_the_next_run(sandbox):
    lock = _locked(sandbox)
    for attempt in range(20):
        prefix = sandbox.root / "envs" / f"k{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "extforge", "install", "default", "--prefix", str(prefix), "--lock",
                                 str(lock)], env=sandbox.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not any((prefix / WORK).glob("staging-*")):
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL and any((prefix / WORK).glob("staging-*")):
            break
        shutil.rmtree(prefix, ignore_errors=True)
    else:
        raise AssertionError("never caught an install with its staging folder in 20 tries")
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0, tmp_must_be_empty=False)
    assert not (prefix / WORK).exists()
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=0, tmp_must_be_empty=False)
