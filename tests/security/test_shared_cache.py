"""One cache root shared by several real users (a site's `EXTFORGE_CACHE=/shared/cache`, sticky
as /tmp is, or a setgid group folder): each user installs from it, nothing one user planted
there locks another out, and a prune removes only what is the pruning user's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

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
