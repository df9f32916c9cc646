"""Install acts only on what it made: a work folder, journal or prefix another user made is
refused before anything is deleted or linked, and the environment's own Python byte-compiles
without running the environment's `.pth` files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from extforge.channel.install import WORK

from .crafted import craft_package, member
from .pyish import SITE, pyish_package


def _as(peer, *cmd: str) -> None:
    subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--", *cmd],
                   check=True, capture_output=True, text=True, cwd="/")


def _site_lock(peer_site, name: str) -> Path:
    """A pixi.lock of pyish that every peer can read, in its own folder of the site."""
    base = peer_site.root / name
    channel = base / "ch"
    pyish_package(channel)
    ws = base / "ws"
    (ws / ".pixi").mkdir(parents=True)
    (ws / "pixi.toml").write_text('[workspace]\nname = "t"\nchannels = ["internal"]\nplatforms = ["linux-64"]\n\n'
                                  '[dependencies]\npyish = "*"\n')
    (ws / ".pixi" / "config.toml").write_text(f'[mirrors]\n"https://conda.anaconda.org/internal" = ["{channel.as_uri()}"]\n')
    locked = subprocess.run([sys.executable, "-m", "extforge", "lock", "--manifest", str(ws / "pixi.toml")],
                            capture_output=True, text=True, env={**os.environ, "EXTFORGE_CACHE": str(base / "rootcache")})
    assert locked.returncode == 0, locked.stderr
    for path in (base, channel, ws):
        path.chmod(0o755)
    return ws / "pixi.lock"


def test_a_journal_another_user_planted_makes_install_delete_nothing(peer_site):
    # A folder shared with the group (sticky, as /tmp is), owned by the victim, who keeps files
    # in it. Another member plants the work folder and a journal naming the victim's files, then
    # the victim installs into the folder: install used to "undo the move" by deleting them.
    lock = _site_lock(peer_site, "journal")
    victim, attacker = peer_site.peers
    shared = peer_site.root / "journal" / "shared"
    shared.mkdir()
    os.chown(shared, victim.uid, peer_site.gid)
    shared.chmod(0o1777)
    _as(victim, "sh", "-c", f"mkdir {shared}/lib && echo mine > {shared}/lib/thesis.tex && echo mine > {shared}/notes")
    work = shared / WORK
    _as(attacker, "sh", "-c", f"mkdir -m 777 {work} && echo '[\"lib\", \"notes\"]' > {work}/moving.json && chmod 666 {work}/moving.json")
    res = peer_site.run(victim, "install", "default", "--prefix", str(shared), "--lock", str(lock))
    assert res.returncode == 2, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert f"refusing to use {work}: it is owned by uid {attacker.uid}, not by you (uid {victim.uid})" in text, res.stderr
    assert (shared / "lib" / "thesis.tex").read_text() == "mine\n" and (shared / "notes").read_text() == "mine\n"
    assert json.loads((work / "moving.json").read_text()) == ["lib", "notes"]  # not ours: left as it was
    # The same journal in a work folder of the victim's that others may write: refused too.
    shutil.rmtree(work)
    _as(victim, "sh", "-c", f"mkdir -m 777 {work} && echo '[\"lib\", \"notes\"]' > {work}/moving.json")
    res = peer_site.run(victim, "install", "default", "--prefix", str(shared), "--lock", str(lock))
    assert res.returncode == 2 and "its mode is drwxrwxrwx, not drwx------" in " ".join(res.stderr.split()), res.stderr
    assert (shared / "lib" / "thesis.tex").exists() and (shared / "notes").exists()


def test_install_refuses_a_prefix_another_user_created(peer_site):
    # Root installing into an empty folder a user made: that user could swap lib/ afterwards.
    lock = _site_lock(peer_site, "foreign")
    user = peer_site.peers[0]
    envs = peer_site.root / "foreign" / "envs"
    envs.mkdir(mode=0o777)
    envs.chmod(0o777)
    _as(user, "mkdir", str(envs / "team"))
    res = subprocess.run([sys.executable, "-m", "extforge", "install", "default", "--prefix", str(envs / "team"), "--lock",
                          str(lock)], capture_output=True, text=True,
                         env={**os.environ, "EXTFORGE_CACHE": str(peer_site.root / "foreign" / "rootcache")})
    assert res.returncode == 2, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert f"prefix {envs / 'team'} belongs to {user.name}, not to you (root)" in text, res.stderr
    assert f"install as {user.name}, or pass a new folder" in text, res.stderr
    assert list((envs / "team").iterdir()) == []
    # Its owner installs there.
    res = peer_site.run(user, "install", "default", "--prefix", str(envs / "team"), "--lock", str(lock))
    assert res.returncode == 0, res.stdout + res.stderr


def _venv_package(channel: Path) -> Path:
    """An environment with a real Python (this host's, copied in, with a pyvenv.cfg that makes
    the copy's site folder the environment's) and a .pth whose code leaves a mark when run."""
    python = Path("/usr/bin/python3.11")
    marker = channel.parent / "pth-ran"
    return craft_package(channel / "linux-64", "venvish", [
        member("bin/python", python.read_bytes(), mode=0o755),
        member("pyvenv.cfg", b"home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n"),
        member(f"{SITE}/venvish/__init__.py", b"VALUE = 1\n"),
        member(f"{SITE}/zz-evil.pth", f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n".encode()),
    ], subdir="linux-64")


def test_byte_compiling_runs_no_pth_file_of_the_environment(sandbox):
    from extforge.channel.index import reindex

    if not Path("/usr/bin/python3.11").exists():
        import pytest

        pytest.skip("needs /usr/bin/python3.11 to stand in for an environment's Python")
    channel = sandbox.path("ch")
    _venv_package(channel)
    reindex(channel)
    lock = sandbox.lock(channel, "venvish")
    prefix = sandbox.root / "envs" / "v"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    record = json.loads((prefix.parent / f".{prefix.name}.extforge-install.json").read_text())
    assert any(p.endswith(".pyc") for p in record["written"]), record["written"]  # its Python did compile
    marker = sandbox.root / "pth-ran"
    assert not marker.exists()
    # The same Python started as a job starts it runs the .pth: the test could have failed.
    subprocess.run([str(prefix / "bin" / "python"), "-c", "pass"], check=True, env={"PATH": "/usr/bin:/bin"})
    assert marker.read_text() == "ran"
