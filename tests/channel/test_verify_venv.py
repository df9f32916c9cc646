"""`extforge verify VENV --lock pylock.toml`: a venv that pip or uv installed from the lock
passes; a changed byte, a RECORD edited to match it, a planted .pth or a .pyc that is not its
source's make it fail, each named. The old code refused any venv ("is not a conda environment",
exit 2): pip users had no check at all."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys

import pytest

from channel.pip_envs import PipSite
from cli_run import run_extforge


@pytest.fixture(scope="module")
def locked(pip_site: PipSite) -> PipSite:
    res = run_extforge("lock", "--manifest", str(pip_site.manifest))
    assert res.returncode == 0, res.stderr
    return pip_site


def _verify(venv, lock, expect: int) -> dict:
    res = run_extforge("verify", str(venv), "--lock", str(lock), "--json")
    assert res.returncode == expect, res.stdout + res.stderr
    return {c["name"]: c for c in json.loads(res.stdout)["checks"]}


def _site(venv):
    (site,) = venv.glob("lib/python3*/site-packages")
    return site


def _installed_by(site: PipSite, client: str, venv):
    if client == "pip":
        res = site.pip_install(venv, "-r", str(site.pylock))
    else:
        res = site.uv_pip("sync", venv, "--require-hashes", str(site.pylock))
    assert res.returncode == 0, res.stderr
    return venv


@pytest.mark.parametrize("client", ["pip", "uv"])
def test_a_venv_installed_from_the_lock_passes_and_a_changed_byte_fails(locked: PipSite, client, tmp_path):
    venv = _installed_by(locked, client, locked.venv(tmp_path / client))
    # Python writes byte code after the install (uv compiles none): checked against its source, no finding.
    subprocess.run([str(venv / "bin" / "python"), "-c", "import pip_ext, pip_pure"], check=True)
    checks = _verify(venv, locked.pylock, 0)
    assert checks["packages"]["summary"].startswith("2 installed vs 2 locked")
    assert "0 problem(s)" in checks["files"]["summary"]

    (so,) = _site(venv).glob("pip_ext/_core*.so")
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.unlink()  # a new file: uv's is a hard link of its cache's copy, which later installs link too
    so.write_bytes(bytes(data))
    rel = so.relative_to(venv)
    checks = _verify(venv, locked.pylock, 1)
    assert any(f.startswith(f"modified: {rel} (pip-ext)") for f in checks["files"]["findings"]), checks["files"]


def test_a_venv_uv_made_passes(locked: PipSite, tmp_path):
    """`uv venv` writes files of its own beside Python's (.gitignore, CACHEDIR.TAG, activate_this.py,
    activate.nu, ...): the old verify named each unowned, so no uv user's venv ever passed."""
    from pip_clients import clean_client_env

    venv = tmp_path / "uv-made"
    subprocess.run([locked.uv, "venv", "--no-config", "-q", "--python", sys.executable, str(venv)], check=True,
                   env=clean_client_env())
    assert (venv / "CACHEDIR.TAG").is_file() and (venv / "bin" / "activate_this.py").is_file()
    _installed_by(locked, "uv", venv)
    checks = _verify(venv, locked.pylock, 0)
    assert checks["unowned"]["verdict"] == "pass", checks["unowned"]


def test_a_record_edited_to_match_a_changed_file_is_still_found(locked: PipSite, tmp_path):
    """The venv's RECORD is no evidence: whoever changes a file rewrites its line as well."""
    venv = _installed_by(locked, "pip", locked.venv(tmp_path / "v"))
    init = _site(venv) / "pip_pure" / "__init__.py"
    init.write_text("import os; VALUE = 42\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(init.read_bytes()).digest()).rstrip(b"=").decode()
    (record,) = _site(venv).glob("pip_pure-*.dist-info/RECORD")
    lines = [f"pip_pure/__init__.py,sha256={digest},{init.stat().st_size}" if line.startswith("pip_pure/__init__.py,")
             else line for line in record.read_text().splitlines()]
    record.write_text("\n".join(lines) + "\n")
    checks = _verify(venv, locked.pylock, 1)
    rel = init.relative_to(venv)
    assert any(f.startswith(f"modified: {rel} (pip-pure)") for f in checks["files"]["findings"]), checks["files"]


def test_a_planted_pth_and_a_foreign_pyc_are_named(locked: PipSite, tmp_path):
    venv = _installed_by(locked, "pip", locked.venv(tmp_path / "v"))
    site = _site(venv)
    (site / "zz-startup.pth").write_text("import os; os.system('true')\n")
    # pip compiled pip_pure/__init__.py at install; the .pyc now holds other code with its header.
    (pyc,) = (site / "pip_pure" / "__pycache__").glob("__init__.*.pyc")
    other = tmp_path / "other.py"
    other.write_text("VALUE = 43\n")
    import py_compile

    py_compile.compile(str(other), cfile=str(tmp_path / "other.pyc"), doraise=True)
    pyc.write_bytes(pyc.read_bytes()[:16] + (tmp_path / "other.pyc").read_bytes()[16:])
    checks = _verify(venv, locked.pylock, 1)
    pth = (site / "zz-startup.pth").relative_to(venv)
    assert f"unowned: {pth} (a .pth file: runs at every python start)" in checks["unowned"]["findings"]
    assert f"byte code: {pyc.relative_to(venv)}: its code is not its source's" in checks["files"]["findings"]


def test_pip_seeded_by_the_venv_passes_and_a_package_off_the_lock_fails(locked: PipSite, tmp_path):
    venv = tmp_path / "with-pip"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _installed_by(locked, "pip", venv)
    checks = _verify(venv, locked.pylock, 0)
    assert "seeded by the venv" in checks["packages"]["summary"]
    res = locked.pip_install(venv, "--no-index", "--find-links", str(locked.wheels[0].parent), "--force-reinstall",
                             "--no-deps", "pip-pure==1.0")
    assert res.returncode == 0, res.stderr
    # The same wheel again: still the lock's. Without --lock, the venv cannot vouch for itself.
    _verify(venv, locked.pylock, 0)
    res = run_extforge("verify", str(venv))
    assert res.returncode == 1 and "--lock pylock.ENV.toml" in res.stderr, res.stderr


def test_a_shared_venv_is_verified_by_another_user_and_a_co_tenants_pth_is_named(pip_site: PipSite, peer_site):
    """A venv on shared storage that a group may write: a site user verifies it with their own
    trust folder and store (the wheels fetched and checked as that user), and a .pth another group
    member planted is named. Run as the real users extforge-peer and extforge-peer2."""
    import os

    from channel.pip_envs import MANIFEST, python_channel, write_index
    from pip_clients import clean_client_env

    root = peer_site.root / "pip-users"
    index = write_index(root / "wheels", pip_site.wheels)
    channel = python_channel(root / "conda")
    ws = root / "ws"
    ws.mkdir()
    short = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (ws / "pixi.toml").write_text(MANIFEST.format(channel=channel.as_uri(), python=short, ext_version="1.0+cpu", index=index))
    assert run_extforge("lock", "--manifest", str(ws / "pixi.toml")).returncode == 0
    venv = root / "venv"
    subprocess.run([peer_site.python, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean_client_env())
    res = pip_site.pip_install(venv, "-r", str(ws / "pylock.node.toml"))
    assert res.returncode == 0, res.stderr
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                os.chown(path, 0, peer_site.gid)
                os.chmod(path, os.stat(path).st_mode | 0o064 | (0o011 if name in dirs or os.access(path, os.X_OK) else 0))
    peer, other = peer_site.peers
    res = peer_site.run(peer, "verify", str(venv), "--lock", str(ws / "pylock.node.toml"))
    assert res.returncode == 0, res.stdout + res.stderr

    (site,) = venv.glob("lib/python3*/site-packages")
    planted = site / "zz-co-tenant.pth"
    planted.write_text("import os\n")
    os.chown(planted, other.uid, peer_site.gid)
    res = peer_site.run(peer, "verify", str(venv), "--lock", str(ws / "pylock.node.toml"), "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert f"unowned: {planted.relative_to(venv)} (a .pth file: runs at every python start)" in checks["unowned"]["findings"]


def test_a_second_verify_reads_no_file_and_a_change_after_it_is_still_found(locked: PipSite, tmp_path):
    """The old verify of a venv hashed every file and compiled every .pyc again at every run (a
    torch venv: seconds at every job start). A clean run records every entry's lstat key, as
    verify_prefix does; the next run of the same lock reads no file and runs no python, and a
    same-size edit with the mtime set back, or a planted .pth, is still found (ctime moves)."""
    # pip's copies: the file is edited in place below (uv's are hard links of its cache's copies).
    venv = _installed_by(locked, "pip", locked.venv(tmp_path / "v"))

    def verify(expect: int, *extra: str) -> dict:
        res = run_extforge("verify", str(venv), "--lock", str(locked.pylock), "--json", *extra)
        assert res.returncode == expect, res.stdout + res.stderr
        return json.loads(res.stdout)

    first = verify(0)
    assert first["files_hashed"] > 0 and first["snapshot"] == "written", first
    second = verify(0)
    assert second["files_hashed"] == 0 and second["files_unchanged_since_snapshot"] > 0, second
    assert verify(0, "--rehash")["files_hashed"] == first["files_hashed"]
    init = _site(venv) / "pip_pure" / "__init__.py"
    st = init.stat()
    init.write_bytes(init.read_bytes().replace(b"42", b"43"))
    os.utime(init, ns=(st.st_atime_ns, st.st_mtime_ns))
    third = verify(1)
    files = next(c for c in third["checks"] if c["name"] == "files")
    assert any(f.startswith(f"modified: {init.relative_to(venv)} (pip-pure)") for f in files["findings"]), files
    init.write_bytes(init.read_bytes().replace(b"43", b"42"))
    verify(0)
    (_site(venv) / "zz-startup.pth").write_text("import os\n")
    unowned = next(c for c in verify(1)["checks"] if c["name"] == "unowned")
    assert any(f.startswith("unowned: ") and "zz-startup.pth" in f for f in unowned["findings"]), unowned
