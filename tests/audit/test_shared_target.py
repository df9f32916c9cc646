"""The torch an audit judges against, in a cache root several users share: the verdict a package
is published on comes from this user's own install of the channel's pinned pytorch."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_packages import _ext_payload, make_conda

from peers import peer_site  # noqa: F401  (the multi-user fixture)
from security.test_install_own_state import _as


@pytest.mark.parametrize(("mode", "who"), [(0o1777, "peer"), (0o2775, "peer"), (0o1777, "owner")],
                         ids=["sticky", "group", "sticky-owner"])
def test_an_audit_target_another_user_planted_in_a_shared_cache_never_judges_my_package(elfs, peer_site, mode, who):  # noqa: F811
    """My package calls a function that the channel's pinned torch lacks (version skew): the audit
    must fail it. Another user of the shared cache root planted `audit-targets/<key>` (a hash of
    the sha256 of the packages the pin solves to: anyone who reads the channel computes it) holding
    a library that has the function. The old code took their folder as its installed target and
    passed the package (exit 0), a verdict it is published on. Now the target is this user's own
    install, under that very name in a folder of its own: exit 1."""
    from rattler.index import index_fs

    victim = peer_site.peers[0] if who == "peer" else None
    attacker = peer_site.peers[1]
    base = peer_site.root / f"audit-{mode:o}-{who}"
    channel = base / "channel"
    (channel / "linux-64").mkdir(parents=True)
    (channel / "noarch").mkdir()
    torch = make_conda(channel / "linux-64", "pytorch", {"lib/libtarget.so": (elfs["v1"] / "libtarget.so").read_bytes()}, [])
    asyncio.run(index_fs(channel))
    payload = _ext_payload(elfs) | {
        "lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so": elfs["skew"].read_bytes()}
    pkg = make_conda(base, "greeter", payload, ["pytorch ==1.0 0"])
    theirs = base / "theirs" / "libtarget.so"  # the library that has the function
    theirs.parent.mkdir()
    theirs.write_bytes((elfs["v2"] / "libtarget.so").read_bytes())
    cache = base / "cache"
    cache.mkdir()
    for p in (base, *base.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    os.chown(cache, 0, peer_site.gid)
    cache.chmod(mode)

    key = hashlib.sha256(hashlib.sha256(torch.read_bytes()).hexdigest().encode()).hexdigest()[:16]
    planted = cache / "audit-targets" / key
    _as(attacker, "sh", "-c", f"umask 000 && mkdir -p {planted}/conda-meta {planted}/lib "
                              f"&& cp {theirs} {planted}/lib/")

    args = ["audit", str(pkg), "--channel", channel.as_uri(), "--json"]
    env = {"EXTFORGE_CACHE": str(cache)}
    if victim is None:
        res = subprocess.run([sys.executable, "-m", "extforge", *args], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=300)
    else:
        res = peer_site.run(victim, *args, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "fail" and any(f.get("symbol") == "greeter::added_in_v2(int)" for f in doc["findings"]), doc
    uid = 0 if victim is None else victim.uid
    assert Path(doc["against"]) == cache / f"audit-targets-{uid}" / key, doc["against"]
