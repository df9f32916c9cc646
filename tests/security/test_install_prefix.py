"""One install at a time per prefix; a pre-created prefix keeps its mode and group; no CACHEDIR.TAG."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from pathlib import Path

from extforge.environment.install import install_lock_path
from extforge.environment.receipt import receipt_path
from extforge.locking import exclusive_or_busy

from .pyish import pyish_package


def _locked(sandbox) -> Path:
    channel = sandbox.path("ch")
    pyish_package(channel)
    return sandbox.lock(channel, "pyish")


def test_second_install_into_a_busy_prefix_says_who_and_exits_2(sandbox):
    lock = _locked(sandbox)
    prefix = sandbox.root / "envs" / "p"
    install_lock_path(prefix).parent.mkdir(parents=True, mode=0o700)
    with sandbox.unchanged_outside(), exclusive_or_busy(install_lock_path(prefix)):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=2)
        res.refused(f"another install is running into {prefix} (pid {os.getpid()})", code=2)
        assert [p.name for p in prefix.iterdir()] == [".extforge"]
    assert not install_lock_path(prefix).exists()


def test_concurrent_installs_into_one_prefix_never_crash(sandbox):
    lock = _locked(sandbox)
    for trial in range(3):
        prefix = sandbox.root / f"envs{trial}" / "p"
        cmd = [sys.executable, "-m", "extforge", "install", "default", "--prefix", str(prefix), "--lock", str(lock)]
        procs = [subprocess.Popen(cmd, env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        assert all(code in (0, 2) for code, _ in outs) and any(code == 0 for code, _ in outs), outs
        for code, err in outs:
            assert "Traceback" not in err, err
            assert code == 0 or f"another install is running into {prefix} (pid " in err, err
        sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), expect=0)
        # No lock file, no staging left: the prefix and its install record.
        assert sorted(p.name for p in prefix.parent.iterdir()) == sorted([prefix.name, receipt_path(prefix).name])


def test_precreated_prefix_keeps_mode_and_group_and_gets_no_cachedir_tag(sandbox):
    lock = _locked(sandbox)
    prefix = sandbox.path("envs", "shared")
    others = [g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getgid()]
    group = others[0] if os.geteuid() == 0 and others else os.getgid()
    os.chown(prefix, -1, group)
    os.chmod(prefix, 0o2750)
    with sandbox.unchanged_outside(prefix):
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    st = prefix.stat()
    assert (oct(st.st_mode & 0o7777), st.st_gid) == (oct(0o2750), group)
    # The setgid folder's group reaches what was installed into it.
    assert (prefix / "lib" / "libpyish.so").stat().st_gid == group
    assert not (prefix / "CACHEDIR.TAG").exists()
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), expect=0)
