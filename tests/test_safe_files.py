"""safe_files writes into folders a co-tenant can write: planted symlinks, FIFOs and a careless
umask must not redirect, hang or hide what extforge writes there."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.locking import exclusive, exclusive_or_busy
from extforge.safe_files import append, make_dir, move_in, open_lock, write_atomic


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    return target


def test_append_refuses_a_planted_symlink(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "log.jsonl").symlink_to(victim)
    with pytest.raises(ExtforgeError, match="symbolic link"):
        append(tmp_path / "log.jsonl", b"line\n")
    assert victim.read_text() == "precious\n"


def test_append_ends_a_torn_line_and_is_group_writable_under_umask_077(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        append(tmp_path / "log", b'{"a"')
        append(tmp_path / "log", b"{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "log").read_bytes() == b'{"a"\n{}\n'
    assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o664


def test_write_atomic_replaces_a_symlink_instead_of_its_target(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "pixi.lock").symlink_to(victim)
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "pixi.lock", b"new")
    finally:
        os.umask(old)
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "pixi.lock").is_symlink()
    assert (tmp_path / "pixi.lock").read_bytes() == b"new"
    assert stat.S_IMODE((tmp_path / "pixi.lock").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pixi.lock", "victim"]


@pytest.mark.parametrize("disk", ["same", "other"])
def test_move_in_replaces_a_link_at_the_name_on_one_disk_or_across_two(tmp_path: Path, victim: Path, disk: str) -> None:
    """A built package goes from the build's own folder into the output folder, where a member
    linked its name to a file of the builder's: renamed on one file system, copied through a
    temporary across two (a cache on another disk, here /dev/shm); the link replaced, its
    target as it was, the package 0644 whatever the umask, nothing left behind."""
    if disk == "other" and (not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev):
        pytest.skip("no second file system at /dev/shm")
    own = Path(tempfile.mkdtemp(dir="/dev/shm" if disk == "other" else tmp_path))
    try:
        (own / "pkg.conda").write_bytes(b"package")
        out = tmp_path / "out"
        (out / "noarch").mkdir(parents=True)
        (out / "noarch" / "pkg.conda").symlink_to(victim)
        old = os.umask(0o077)
        try:
            move_in(own / "pkg.conda", out / "noarch" / "pkg.conda", beneath=out)
        finally:
            os.umask(old)
        placed = out / "noarch" / "pkg.conda"
        assert victim.read_text() == "precious\n" and not placed.is_symlink() and placed.read_bytes() == b"package"
        assert stat.S_IMODE(placed.stat().st_mode) == 0o644
        assert os.listdir(own) == [] and os.listdir(out / "noarch") == ["pkg.conda"]
    finally:
        shutil.rmtree(own)


def test_a_fifo_or_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "log")
    (tmp_path / "lock").mkdir()
    with pytest.raises(ExtforgeError, match="not a regular file"):
        append(tmp_path / "log", b"x\n")
    with pytest.raises(ExtforgeError, match="not a regular file"):
        open_lock(tmp_path / "lock")


def test_locks_refuse_symlinks_and_create_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    inside = tmp_path / "channel"
    inside.mkdir()
    (inside / ".lock").symlink_to(outside / "created")
    outside.mkdir()
    for take in (exclusive, exclusive_or_busy):
        with pytest.raises(ExtforgeError, match="symbolic link"), take(inside / ".lock"):
            pass
    assert list(outside.iterdir()) == []


def test_lock_files_are_group_writable_and_lockable(tmp_path: Path) -> None:
    fd = open_lock(tmp_path / ".lock")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert stat.S_IMODE((tmp_path / ".lock").stat().st_mode) == 0o664


def test_make_dir_takes_the_group_bits_of_its_parent(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o2775)
    old = os.umask(0o077)
    try:
        make_dir(tmp_path / "linux-64")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "linux-64").stat().st_mode) == 0o2775
    (tmp_path / "noarch").symlink_to(tmp_path / "linux-64")
    with pytest.raises(ExtforgeError, match="not a folder"):
        make_dir(tmp_path / "noarch")


def test_transient_locks_leave_nothing_and_say_who_holds_them(tmp_path: Path) -> None:
    with exclusive(tmp_path / ".ws.lock", transient=True):
        assert (tmp_path / ".ws.lock").exists()
    with exclusive_or_busy(tmp_path / ".prefix.lock"):
        # lockf locks belong to the process: the other holder is a child
        code = ("import sys; from pathlib import Path; from extforge.locking import Busy, exclusive_or_busy\n"
                "try:\n    exclusive_or_busy(Path(sys.argv[1])).__enter__()\nexcept Busy as b:\n    print(b.holder)")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / ".prefix.lock")], capture_output=True, text=True)
        assert out.stdout.strip() == str(os.getpid()), out.stderr
    assert list(tmp_path.iterdir()) == []


def test_set_mode_leaves_a_file_that_has_the_mode_alone(tmp_path: Path):
    """A chmod moves the ctime even to the same mode, and the channel index reads every package
    whose ctime moved since its repodata was written: a warm channel was read again in full."""
    import time

    from extforge import safe_files

    kept, changed = tmp_path / "kept.conda", tmp_path / "changed.conda"
    for f, mode in ((kept, 0o644), (changed, 0o600)):
        f.write_bytes(b"x")
        f.chmod(mode)
    before = {f: f.stat().st_ctime_ns for f in (kept, changed)}
    time.sleep(0.05)  # past the filesystem clock's tick
    assert safe_files.set_mode(kept, 0o644) and safe_files.set_mode(changed, 0o644)
    assert kept.stat().st_ctime_ns == before[kept]
    assert stat.S_IMODE(changed.stat().st_mode) == 0o644 and changed.stat().st_ctime_ns > before[changed]
