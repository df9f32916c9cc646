"""Install acts only on what it made: a work folder, journal or prefix another user made is
refused before anything is deleted or linked, a journal its own install did not sign for the
prefix is refused though the folder is the user's, and the python package's interpreter
byte-compiles without running the environment's `.pth` files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from extforge.environment.install import JOURNAL, WORK

from .conftest import listing
from .crafted import craft_package, member
from .pyish import pyish_package


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


def _victims_sticky_folder(peer_site, name: str):
    """A lock to install, the two peers, and a folder shared with the group (sticky, as /tmp is)
    that the victim owns."""
    lock = _site_lock(peer_site, name)
    victim, attacker = peer_site.peers
    shared = peer_site.root / name / "shared"
    shared.mkdir()
    os.chown(shared, victim.uid, peer_site.gid)
    shared.chmod(0o1777)
    return lock, victim, attacker, shared


def test_a_journal_another_user_planted_makes_install_delete_nothing(peer_site):
    # A folder shared with the group (sticky, as /tmp is), owned by the victim, who keeps files
    # in it. Another member plants the work folder and a journal naming the victim's files, then
    # the victim installs into the folder: install used to "undo the move" by deleting them.
    lock, victim, attacker, shared = _victims_sticky_folder(peer_site, "journal")
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


# A real `extforge install` that SIGKILLs itself once the first staging entry reached the prefix:
# a move cut short, at a point an outside kill hits only by luck.
_KILLED_MID_MOVE = """
import os, signal, sys
from extforge import safe_files
from extforge.cli import main

rename = safe_files.rename

def rename_then_die(src, dst, *, beneath=None):
    rename(src, dst, beneath=beneath)
    if dst.parent == beneath:
        os.kill(os.getpid(), signal.SIGKILL)

safe_files.rename = rename_then_die
sys.argv = ["extforge", *sys.argv[1:]]
sys.exit(main())
"""


def _killed_mid_move(sandbox, lock: Path, prefix: Path) -> dict:
    """The journal's body, once the install was killed with `bin` moved into the prefix."""
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_MOVE, "install", "default", "--prefix", str(prefix), "--lock",
                           str(lock)], env=sandbox.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert sorted(p.name for p in prefix.iterdir()) == [WORK, "bin"]  # moved, with no conda-meta yet
    body = json.loads((prefix / WORK / JOURNAL).read_bytes().partition(b"\n")[2])
    assert sorted(p.name for p in (prefix / WORK).iterdir()) == ["install.lock", JOURNAL, body["staging"]]
    return body


def _state(folder: Path) -> dict:
    """listing() of folder but the lock file a killed install left: every later run takes that
    lock before it reads the journal, and removes it on release."""
    found = listing(folder)
    found.pop(f"{WORK}/install.lock", None)
    return found


def test_an_install_killed_mid_move_is_undone_with_its_signed_journal(sandbox):
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    prefix = sandbox.root / "envs" / "k"
    body = _killed_mid_move(sandbox, lock, prefix)
    assert body["prefix"] == str(prefix) and body["moving"] == ["bin", "lib", "conda-meta"]
    assert body["staging"].startswith("staging-")
    mac = (prefix / WORK / JOURNAL).read_bytes().partition(b"\n")[0]
    assert len(mac) == 64 and int(mac, 16) >= 0  # an HMAC-SHA256 in hex
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert not (prefix / WORK).exists()
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=0)


def test_a_journal_without_a_valid_mac_or_for_another_prefix_deletes_nothing(sandbox):
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    prefix = sandbox.root / "envs" / "k"
    _killed_mid_move(sandbox, lock, prefix)
    (prefix / "notes").write_text("mine\n")  # the user's, in their own prefix
    journal = prefix / WORK / JOURNAL
    signed = journal.read_bytes()
    mac, _, body = signed.partition(b"\n")
    edited = json.loads(body)
    edited["moving"].append("notes")
    unsigned = json.dumps(["bin", "notes"]).encode()  # what install wrote before journals were signed
    for planted in (unsigned, mac + b"\n" + json.dumps(edited, separators=(",", ":")).encode(), b"\n" + body):
        journal.write_bytes(planted)
        before = _state(prefix)
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=2)
        res.refused(f"refusing to act on {journal}: it carries no valid MAC of yours", "nothing was deleted",
                    f"remove {prefix / WORK} yourself")
        assert _state(prefix) == before
    # A folder of the user's holding the same names, with the valid journal of the killed install
    # copied in (cp -a): undoing "the move" there would delete the folder's own bin/ and lib/.
    other = sandbox.path("data")
    for name in ("bin", "lib"):
        (other / name).mkdir()
        (other / name / "keep").write_text("mine\n")
    shutil.copytree(prefix / WORK, other / WORK, symlinks=True)
    (other / WORK / JOURNAL).write_bytes(signed)
    before = _state(other)
    res = sandbox.run("install", "default", "--prefix", str(other), "--lock", str(lock), expect=2)
    res.refused(f"refusing to act on {other / WORK / JOURNAL}: it was written for another prefix ({prefix})",
                "nothing was deleted")
    assert _state(other) == before
    # The journal as the killed install wrote it: the same prefix is undone and installed.
    journal.write_bytes(signed)
    (prefix / "notes").unlink()
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert not (prefix / WORK).exists()


def test_a_staging_folder_no_signed_journal_names_is_refused(sandbox):
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    prefix = sandbox.path("envs", "s")
    work = prefix / WORK
    work.mkdir(mode=0o700)
    (work / "staging-999999" / "lib").mkdir(parents=True)
    (work / "staging-999999" / "lib" / "data").write_text("mine\n")
    before = listing(prefix)
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=2)
    res.refused(f"refusing to act on {work / 'staging-999999'}: no journal of an install of yours names it",
                "nothing was deleted")
    assert listing(prefix) == before


def test_a_journal_another_user_signed_is_refused_in_a_folder_of_ones_own(peer_site):
    # The folder checks pass: the victim made the work folder and (after an earlier refusal of its
    # mode) made it private again, but a member had planted a journal in it meanwhile, signed
    # with that member's own key. It names the victim's files.
    lock, victim, attacker, shared = _victims_sticky_folder(peer_site, "signed")
    work = shared / WORK
    _as(victim, "sh", "-c", f"mkdir {shared}/lib && echo mine > {shared}/lib/thesis.tex && mkdir -m 777 {work}")
    cache = peer_site.root / "signed" / f"cache-{attacker.name}"
    cache.mkdir(mode=0o700)
    os.chown(cache, attacker.uid, attacker.gid)
    sign = ("import os, site, sys; site.addsitedir(sys.argv[1]); os.environ['EXTFORGE_CACHE'] = sys.argv[2]; "
            "from extforge.environment.trust import sign; "
            "body = {'journal': 1, 'prefix': sys.argv[3], 'staging': 'staging-1', 'moving': ['lib']}; "
            "open(sys.argv[4], 'wb').write(sign(body)); os.chmod(sys.argv[4], 0o644)")
    _as(attacker, peer_site.python, "-c", sign, sysconfig.get_paths()["purelib"], str(cache), str(shared), str(work / JOURNAL))
    assert (cache / f"trust-{attacker.uid}" / "secret").exists()  # signed with the attacker's own key
    _as(victim, "chmod", "700", str(work))
    before = listing(shared)
    res = peer_site.run(victim, "install", "default", "--prefix", str(shared), "--lock", str(lock))
    assert res.returncode == 2, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert f"refusing to act on {work / JOURNAL}: it carries no valid MAC of yours" in text, res.stderr
    assert listing(shared) == before
    assert (shared / "lib" / "thesis.tex").read_text() == "mine\n"


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


def test_byte_compiling_runs_no_pth_file_of_the_environment(sandbox, mirror_python):
    from extforge.publishing.index import reindex

    channel = sandbox.path("ch")
    (channel / "linux-64").mkdir()
    shutil.copy(mirror_python, channel / "linux-64")
    marker = sandbox.root / "pth-ran"
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    craft_package(channel / "linux-64", "venvish", [
        member(f"{site}/venvish/__init__.py", b"VALUE = 1\n"),
        member(f"{site}/zz-evil.pth", f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n".encode()),
    ], subdir="linux-64", index={"depends": ["python"]})
    reindex(channel)
    lock = sandbox.lock(channel, "venvish")
    prefix = sandbox.root / "envs" / "v"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    record = json.loads((prefix.parent / f".{prefix.name}.extforge-install.json").read_text())
    assert f"{site}/venvish/__pycache__/__init__.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc" in record["written"]
    assert not marker.exists()
    # The same Python started as a job starts it runs the .pth: the test could have failed.
    subprocess.run([str(prefix / "bin" / "python"), "-c", "pass"], check=True, env={"PATH": "/usr/bin:/bin"})
    assert marker.read_text() == "ran"
