"""A recipe is code that runs as its builder: one another user can write is refused before any of
it runs, and the build reads the copy checked as it was made (recipes.trust). Each case is set up
by real users of a site (tests/peers.py) on a tiny real recipe that rattler-build builds in a
second, with root (or a peer) running the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from package_files import package_member

from .conftest import Result
from .test_shared_state import _as, _extforge

RECIPE = 'schema_version: 1\npackage: {name: trust-demo, version: "1.0"}\nbuild: {noarch: generic}\n'
BUILD_SH = 'mkdir -p "$PREFIX/share/trust-demo" && echo built > "$PREFIX/share/trust-demo/who"\n'


def _write_recipe(folder: Path, umask: int = 0o022) -> Path:
    """The trust-demo recipe (its build script build.sh) written into `folder` with `umask`."""
    old = os.umask(umask)
    try:
        folder.mkdir(exist_ok=True)
        (folder / "recipe.yaml").write_text(RECIPE)
        (folder / "build.sh").write_text(BUILD_SH)
    finally:
        os.umask(old)
    return folder


def _plant_marker(peer, recipe: Path, marker: Path) -> None:
    """The member's edit: their command at the end of the build script (it runs as whoever builds)."""
    _as(peer, "sh", "-c", 'echo "id -u > $2" >> "$1/build.sh"', "_", str(recipe), str(marker))


def _build(base: Path, recipe: Path) -> Result:
    channel = base / "channel"
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    return _extforge("build", str(recipe), "--channel", str(channel), "--output-dir", str(base / "out"), "--no-test",
                     "--no-audit", env={"EXTFORGE_CACHE": str(base / "cache")})


def _refused(res: Result, path: Path, *who: str) -> None:
    assert res.returncode == 2, res.output
    line = next(line for line in res.stderr.splitlines() if line.startswith("error: "))
    assert "refusing to run the recipe" in line and f": {path}: " in line, res.stderr
    assert all(name in line for name in who), res.stderr
    assert "would run as you" in res.stderr and "chmod g-w,o-w" in res.stderr and "cp -r" in res.stderr


def test_a_recipe_folder_a_group_member_can_write_is_refused_before_it_runs(peer_site, tmp_path: Path) -> None:
    """Root keeps the recipe in a group's folder (2775, umask 002: its files 664); a member adds
    their command to build.sh. main built it: the command ran as root (MARKER written). Now the
    build is refused (exit 2) naming the folder, its group and the member; MARKER stays absent."""
    recipe = _write_recipe(peer_site.shared_folder("trust-group"), umask=0o002)
    marker = tmp_path / "MARKER"
    _plant_marker(peer_site.peers[1], recipe, marker)
    res = _build(peer_site.root / "trust-group-build", recipe)
    _refused(res, recipe, "extforge-site", "extforge-peer, extforge-peer2")
    assert not marker.exists(), "a member's edit ran as the builder"


def test_a_recipe_file_another_user_owns_is_refused(peer_site, tmp_path: Path) -> None:
    """root's recipe folder (0755) holds a build.sh a member owns (mode 644: a patch they
    contributed), and they edit it. main built it: their command ran as root. Now refused naming
    the file and its owner; MARKER stays absent."""
    peer = peer_site.peers[1]
    recipe = _write_recipe(peer_site.root / "trust-owned")
    os.chown(recipe / "build.sh", peer.uid, peer.gid)
    marker = tmp_path / "MARKER"
    _plant_marker(peer, recipe, marker)
    res = _build(peer_site.root / "trust-owned-build", recipe)
    _refused(res, recipe / "build.sh", f"uid {peer.uid} (extforge-peer2)")
    assert not marker.exists(), "a member's edit ran as the builder"


def test_an_ancestor_a_member_can_write_is_refused_and_a_sticky_one_builds(peer_site, tmp_path: Path) -> None:
    """root's recipe (0755, files 644) in a group's folder (2775) that is not sticky: a member
    renames it away and puts their copy, with their command, in its place. main built theirs:
    the command ran as root. Now refused naming that folder (MARKER absent). The same recipe in a
    /tmp-like folder (1777: nobody may rename what is not theirs) builds."""
    attacker = peer_site.peers[1]
    shared = peer_site.shared_folder("trust-above")
    recipe = _write_recipe(shared / "trust-demo")
    marker = tmp_path / "MARKER"
    _as(attacker, "sh", "-c", 'mv "$1" "$1.old" && cp -r "$1.old" "$1"', "_", str(recipe))
    _plant_marker(attacker, recipe, marker)
    res = _build(peer_site.root / "trust-above-build", recipe)
    _refused(res, shared, "extforge-peer, extforge-peer2")
    assert not marker.exists(), "a member's recipe ran as the builder"

    sticky = peer_site.root / "trust-sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    recipe = _write_recipe(sticky / "trust-demo")
    moved = subprocess.run(["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}", "--init-groups",
                            "--inh-caps=-all", "--", "mv", str(recipe), f"{recipe}.old"], capture_output=True, cwd="/")
    assert moved.returncode != 0  # the sticky bit: not theirs to rename
    res = _build(peer_site.root / "trust-sticky-build", recipe)
    assert res.returncode == 0, res.output


def test_a_group_writable_recipe_builds_in_the_builders_own_private_group_only(peer_site) -> None:
    """A peer builds their own recipe (2775 folder, 664 files: umask 002) whose group is their
    user private group (no other member): it builds, as one's own checkout with umask 002 must.
    The same recipe given the site's group (the other peer a member) is refused. main built both."""
    builder = peer_site.peers[0]
    home = peer_site.root / "trust-upg"
    home.mkdir()
    os.chown(home, builder.uid, builder.gid)
    recipe = home / "trust-demo"
    _as(builder, "sh", "-c", 'umask 002 && mkdir -m 2775 "$1" && printf "%s" "$2" > "$1/recipe.yaml" && '
        'printf "%s" "$3" > "$1/build.sh" && mkdir -p "$4/channel/noarch"', "_", str(recipe), RECIPE, BUILD_SH, str(home))
    args = ("build", str(recipe), "--channel", str(home / "channel"), "--output-dir", str(home / "out"), "--no-test", "--no-audit")
    res = peer_site.run(builder, *args, umask=0o002)
    assert res.returncode == 0, res.stdout + res.stderr
    assert list((home / "out" / "noarch").glob("trust-demo-*.conda"))

    _as(builder, "chgrp", "-R", str(peer_site.gid), str(recipe))
    res = peer_site.run(builder, *args, umask=0o002)
    assert res.returncode == 2 and f"refusing to run the recipe {recipe}: {recipe}: " in res.stderr, res.stderr
    assert "extforge-peer2" in res.stderr


# The member's process: build.sh opened for writing while it was still group-writable, held
# across the admin's `chmod -R g-w`; once the build has begun (its log exists), their command
# goes into the file through that descriptor.
HOLD = """
import glob, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
open(sys.argv[2], "w").close()
deadline = time.time() + 120
while not glob.glob(sys.argv[3] + "/logs/*.log") and time.time() < deadline:
    time.sleep(0.001)
payload = os.read(fd, 65536) + ("id -u > %s\\n" % sys.argv[4]).encode()
os.pwrite(fd, payload, 0)
"""


def test_a_file_a_member_rewrites_after_the_check_never_reaches_the_build(peer_site, tmp_path: Path) -> None:
    """A member opened build.sh while the group's recipe folder let them (664), root then ran the
    fix the refusal names (`chmod -R g-w`) and built; the moment the build has begun (its log),
    the member writes their command into build.sh through the descriptor they kept. main's
    rattler-build read build.sh from the recipe folder when it ran the script: their command ran
    as root (MARKER). Now the build reads the copy checked before the log: MARKER stays absent
    and the package's recipe is root's."""
    attacker = peer_site.peers[1]
    recipe = _write_recipe(peer_site.shared_folder("trust-held"), umask=0o002)
    base = peer_site.root / "trust-held-build"
    (base / "out").mkdir(parents=True)
    flags = peer_site.root / "trust-held-flag"
    flags.mkdir()
    flags.chmod(0o777)
    ready = flags / "ready"
    marker = tmp_path / "MARKER"
    hold = subprocess.Popen(["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}", "--init-groups",
                             "--inh-caps=-all", "--", peer_site.python, "-c", HOLD, str(recipe / "build.sh"), str(ready),
                             str(base / "out"), str(marker)], cwd="/")
    try:
        for _ in range(300):
            if ready.exists():
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert ready.exists(), "the member's process did not start"
        subprocess.run(["chmod", "-R", "g-w", str(recipe)], check=True)
        res = _build(base, recipe)
    finally:
        hold.wait(timeout=150)
    assert b"id -u" in (recipe / "build.sh").read_bytes(), "the member's write did not happen"
    assert not marker.exists(), "a member's edit ran as the builder"
    assert res.returncode == 0, res.output
    (package,) = (base / "out" / "noarch").glob("trust-demo-*.conda")
    assert package_member(package, "info/recipe/build.sh") == BUILD_SH.encode()
    shutil.rmtree(base / "cache", ignore_errors=True)
