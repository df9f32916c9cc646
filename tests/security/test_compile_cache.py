"""A compile cache others can write hands a build their objects: ccache returns whatever a result
file holds under the key, whoever wrote it. Real users (tests/peers.py), real g++ and ccache,
compiles through extforge's own launcher (data/compile-launcher.sh) with the variables
`compile_cache.env` gives: a peer's planted result must never reach root's object, a per-user
folder the peer made is refused, and doctor says which folder is in force and why."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from extforge import compile_cache
from extforge.building.build import build_environment
from extforge.building.parts import Part
from extforge.errors import ExtforgeError

# Compiles unit.cpp in the folder argv[2] through a compile cache in argv[1], as a build does.
COMPILE = ("import os, site, subprocess, sys; site.addsitedir(sys.argv[3]); from pathlib import Path; "
           "from extforge import compile_cache; "
           "env = {**os.environ, **compile_cache.env('ccache', cache_dir=Path(sys.argv[1]))}; "
           "cmd = [*env['EXTFORGE_COMPILER_LAUNCHER'].split(), 'g++', '-c', 'unit.cpp', '-o', 'unit.o']; "
           "sys.exit(subprocess.run(cmd, env=env, cwd=sys.argv[2]).returncode)")
# The peer's own object under the same name: what it plants in place of every result it can write.
PLANT = ("import pathlib, sys; evil = pathlib.Path(sys.argv[1]).read_bytes(); n = 0\n"
         "for f in pathlib.Path(sys.argv[2]).rglob('*R'):\n"
         "    try: f.write_bytes(evil); n += 1\n"
         "    except OSError: pass\n"
         "print(n)")


def _as(peer, *cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all",
                           "--", "sh", "-c", 'umask 002; exec "$@"', "sh", *cmd],
                          capture_output=True, text=True, cwd="/", env=env, check=True)


def _work(peer_site, name: str, symbol: str, owner) -> Path:
    """A folder holding unit.cpp that defines `symbol`, writable by `owner` (None: root)."""
    work = peer_site.root / name
    work.mkdir()
    (work / "unit.cpp").write_text(f'extern "C" int {symbol}() {{ return 42; }}\n')
    if owner:
        os.chown(work, owner.uid, owner.gid)
    return work


def _symbols(obj: Path) -> set[str]:
    nm = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in nm.splitlines() if " T " in line}


@pytest.fixture()
def tools(ccache: str) -> dict[str, str]:
    return {"PATH": f"{Path(ccache).parent}:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C"}


def test_another_users_planted_result_never_becomes_my_object(peer_site, tools: dict[str, str]) -> None:
    """Old code: every user compiled straight into the group's folder, and root's compile of the
    same source was a hit on the peer's planted result: root's unit.o defined `planted`."""
    peer = peer_site.peers[0]
    shared = peer_site.shared_folder("compile-cache")  # as docs/site-admin.md sets one up: 2775, the group's
    purelib = sysconfig.get_paths()["purelib"]
    # The peer compiles the unit through extforge, as its own builds would: its results fill the cache.
    honest = _work(peer_site, "peer-work", "mine", peer)
    _as(peer, peer_site.python, "-c", COMPILE, str(shared), str(honest), purelib, env=tools)
    # Its own object of that name, defining another symbol, made in a cache of its own...
    evil = _work(peer_site, "peer-evil", "planted", peer)
    evil_cache = peer_site.root / "peer-evil-cache"
    evil_cache.mkdir()
    os.chown(evil_cache, peer.uid, peer.gid)
    _as(peer, "sh", "-c", f"cd {evil} && CCACHE_DIR={evil_cache} ccache g++ -c unit.cpp -o unit.o", env=tools)
    (evil_result,) = evil_cache.rglob("*R")
    # ...is written over every result file it can write in the shared folder.
    planted = int(_as(peer, peer_site.python, "-c", PLANT, str(evil_result), str(shared), env=tools).stdout)
    assert planted >= 1, "the peer found no result to replace: the test would prove nothing"

    mine = _work(peer_site, "root-work", "mine", None)
    subprocess.run([sys.executable, "-c", COMPILE, str(shared), str(mine), purelib], env=tools, check=True,
                   capture_output=True)
    assert _symbols(mine / "unit.o") == {"mine"}
    # Root's results live in a folder of its own, 0700, every file in it 0600.
    own = shared / "user-0"
    assert own.stat().st_mode & 0o777 == 0o700 and own.stat().st_uid == 0  # (setgid from the group's folder)
    modes = {stat.S_IMODE(p.lstat().st_mode) for p in own.rglob("*") if p.is_file()}
    assert modes and not any(m & 0o077 for m in modes), modes
    assert not any(p.is_dir() and stat.S_IMODE(p.stat().st_mode) & 0o077 for p in own.rglob("*"))
    # Root's next build (another process, another output folder: a split build's link job) shares it.
    again = _work(peer_site, "root-work-2", "mine", None)
    subprocess.run([sys.executable, "-c", COMPILE, str(shared), str(again), purelib], env=tools, check=True,
                   capture_output=True)
    stats = subprocess.run(["ccache", "--print-stats"], env={**tools, "CCACHE_DIR": str(own)}, capture_output=True,
                           text=True, check=True).stdout
    assert "direct_cache_hit\t1" in stats.splitlines() and _symbols(again / "unit.o") == {"mine"}


def test_a_cache_folder_swapped_while_the_build_runs_is_never_used(peer_site, tools: dict[str, str]) -> None:
    """The build has set up its folder; then a member renames the site's compile folder away (the
    cache root is the group's, without the sticky bit) and puts a tree of planted results in its
    place, at the folder's top and as root's per-user folder. Old code compiled from the
    configured folder by its path: root's unit.o defined `planted`."""
    peer = peer_site.peers[0]
    cache_root = peer_site.shared_folder("swapped")
    configured = cache_root / "compile" / "ccache"
    env = {**tools, **compile_cache.env("ccache", cache_dir=configured)}  # as `extforge build` sets up
    # The member's tree: its own compile of the unit, every result then replaced by its object.
    tree = peer_site.root / "peer-tree"
    tree.mkdir(mode=0o700)
    os.chown(tree, peer.uid, peer.gid)
    honest = _work(peer_site, "swap-peer-work", "mine", peer)
    evil = _work(peer_site, "swap-peer-evil", "planted", peer)
    same_key = {k: v for k, v in env.items() if k.startswith("CCACHE_") and k != "CCACHE_DIR"}
    _as(peer, "sh", "-c", f"cd {honest} && ccache g++ -c unit.cpp -o unit.o && cd {evil} && "
        f"CCACHE_DIR={tree}/evil ccache g++ -c unit.cpp -o unit.o", env={**tools, **same_key, "CCACHE_DIR": str(tree)})
    (evil_result,) = (tree / "evil").rglob("*R")
    assert int(_as(peer, peer_site.python, "-c", PLANT, str(evil_result), str(tree), env=tools).stdout) >= 2
    _as(peer, "sh", "-c", f"mv {cache_root}/compile {cache_root}/compile.old && mkdir -p {configured} && "
        f"cp -a {tree}/. {configured}/ && cp -a {tree} {configured}/user-0 && chmod -R a+rwX {configured}", env=tools)

    mine = _work(peer_site, "swap-root-work", "mine", None)
    proc = subprocess.run([*env["EXTFORGE_COMPILER_LAUNCHER"].split(), "g++", "-c", "unit.cpp", "-o", "unit.o"],
                          env=env, cwd=mine, capture_output=True, text=True, check=True)
    assert _symbols(mine / "unit.o") == {"mine"}
    assert f"compiling without the compile cache: {configured}" in proc.stderr, proc.stderr


@pytest.mark.parametrize("planted", ["their folder", "open to all", "a link to theirs"])
def test_a_per_user_folder_another_user_made_is_refused_never_used(peer_site, tools: dict[str, str],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    planted: str) -> None:
    """Old code: the group's folder itself was the cache, so whatever the peer put there was used;
    there was no per-user folder to refuse."""
    peer = peer_site.peers[0]
    root = peer_site.shared_folder(f"cache-root-{planted.replace(' ', '-')}")  # one EXTFORGE_CACHE for the site
    theirs = root / "compile" / "ccache" / "user-0"
    made = {"their folder": f"mkdir -p {theirs} && chmod 700 {theirs}",
            "open to all": f"mkdir -p {theirs} && chmod 777 {theirs}",
            "a link to theirs": f"mkdir -p {root}/elsewhere {theirs.parent} && ln -s {root}/elsewhere {theirs}"}[planted]
    _as(peer, "sh", "-c", made, env=tools)
    monkeypatch.setenv("EXTFORGE_CACHE", str(root))
    monkeypatch.setenv("PATH", tools["PATH"])

    with pytest.raises(ExtforgeError) as refused:
        compile_cache.env("ccache")
    assert refused.value.what.startswith(f"refusing to use {theirs}: "), refused.value.what
    assert "\n" not in refused.value.what and f"rm -r {theirs}" in refused.value.fix
    # A build goes on without the cache; a split build, which needs one, is refused with that reason.
    env = build_environment("", [], {}, "no-such-profile")
    assert not any(k.startswith("CCACHE") or k == "EXTFORGE_COMPILER_LAUNCHER" for k in env)
    with pytest.raises(ExtforgeError) as split:
        build_environment("", [], {}, "no-such-profile", Part(2, 1))
    assert "needs a compile cache" in split.value.what and split.value.why == refused.value.what
    if planted == "a link to theirs":
        assert not any((root / "elsewhere").iterdir())

    doctor = subprocess.run([sys.executable, "-m", "extforge", "doctor", "--json"], capture_output=True, text=True,
                            env={**os.environ, "EXTFORGE_CACHE": str(root)})
    report = json.loads(doctor.stdout)
    facts = report["facts"]["compile_cache"]
    assert (facts["use"], facts["path"], facts["why"]) == ("refused", str(theirs), refused.value.what)
    assert any(f["severity"] == "warning" and refused.value.what in f["title"] and f["fix"] == refused.value.fix
               for f in report["findings"])


def test_doctor_says_which_compile_cache_folder_is_in_force(peer_site, tmp_path: Path, tools: dict[str, str]) -> None:
    """Old code: doctor said nothing about the compile cache."""
    shared = peer_site.shared_folder("doctor-cache")
    (shared / "compile" / "ccache").mkdir(parents=True)
    (shared / "compile" / "ccache").chmod(0o2775)  # the group's, as the site's cache root
    private = tmp_path / "mine"
    (private / "compile" / "ccache").mkdir(parents=True)
    (private / "compile" / "ccache").chmod(0o700)
    for cache_root, line, use in (
        (shared, f"ccache: {shared}/compile/ccache/user-0, per-user (others can write {shared}/compile/ccache, "
                 "drwxrwsr-x)", "per-user"),
        (private, f"ccache: {private}/compile/ccache, private", "private"),
    ):
        env = {**os.environ, "PATH": f"{os.environ['PATH']}:{tools['PATH']}", "EXTFORGE_CACHE": str(cache_root)}
        proc = subprocess.run([sys.executable, "-m", "extforge", "doctor"], capture_output=True, text=True, env=env)
        assert f"compile cache  {line}" in (proc.stdout + proc.stderr).splitlines(), proc.stdout + proc.stderr
        facts = json.loads(subprocess.run([sys.executable, "-m", "extforge", "doctor", "--json"], capture_output=True, text=True,
                                          env=env).stdout)["facts"]["compile_cache"]
        assert (facts["tool"], facts["use"]) == ("ccache", use)


def test_a_cache_folder_one_may_not_write_is_one_line(peer_site, tools: dict[str, str]) -> None:
    """Another admin's compile folder, 755: the second admin's compiles cannot have a folder there.
    Old code handed ccache the first admin's folder itself (their objects, and no write)."""
    owner, other = peer_site.peers
    cache_root = peer_site.shared_folder("not-writable")
    configured = cache_root / "compile" / "ccache"
    _as(owner, "sh", "-c", f"mkdir -p {configured} && chmod 755 {configured}", env=tools)
    code = ("import site, sys; site.addsitedir(sys.argv[2]); from pathlib import Path; "
            "from extforge import compile_cache; from extforge.errors import ExtforgeError\n"
            "try: compile_cache.env('ccache', cache_dir=Path(sys.argv[1]))\n"
            "except ExtforgeError as exc: print(exc.what); print(exc.fix)")
    out = _as(other, peer_site.python, "-c", code, str(configured), sysconfig.get_paths()["purelib"], env=tools).stdout
    assert out.splitlines() == [f"cannot make {configured}/user-{other.uid}: you may not write {configured}",
                                f"have its owner let the group write it (`chmod 2775 {configured}`, as for a shared "
                                "channel) or set EXTFORGE_CACHE to a folder of your own"], out
