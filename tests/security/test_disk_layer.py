"""One layer (safe_files) for every change extforge makes on disk where others can write: a
link planted in the cache, a channel or a log folder must not lead a prune, a re-index chmod
or a crash log to a target elsewhere."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from extforge import cli
from extforge.publishing.index import index_channel


def _old(path: Path, days: float = 30) -> None:
    then = time.time() - days * 24 * 3600
    os.utime(path, (then, then), follow_symlinks=False)


def test_prune_never_follows_an_area_folder_that_is_a_link(sandbox):
    # Someone who can write the shared cache root replaced its `logs` area with a link to an
    # unrelated folder of old files; `cache --prune` used to delete them.
    unrelated = sandbox.path("unrelated")
    for name in ("thesis.tex", "data"):
        (unrelated / name).write_text("mine")
        _old(unrelated / name)
    (sandbox.cache / "logs").symlink_to(unrelated)
    own = sandbox.cache / "mirror" / "wheel-store"
    own.mkdir(parents=True)
    (own / "old.whl").write_text("x")
    _old(own / "old.whl")
    with sandbox.unchanged_outside():
        sandbox.run("cache", "--prune", "1", expect=0)
    assert sorted(p.name for p in unrelated.iterdir()) == ["data", "thesis.tex"]
    assert not (own / "old.whl").exists()  # the prune itself still works
    assert (sandbox.cache / "logs").is_symlink()


def test_reindex_never_chmods_through_a_planted_link(tmp_path: Path):
    # build and mirror re-index their output folder and make what they wrote 0644: a link there
    # to a private file made it world-readable.
    private = tmp_path / "private"
    private.write_text("secret")
    private.chmod(0o600)
    channel = tmp_path / "out"
    (channel / "linux-64").mkdir(parents=True)
    (channel / "linux-64" / "evil-1.0-0.conda").symlink_to(private)
    fifo = channel / "noarch" / "fifo-1.0-0.conda"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    index_channel(channel)  # a FIFO under a package name is not opened: this returns
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    served = (channel / "linux-64" / "repodata.json").read_text()
    assert "evil" not in served


def test_a_crash_log_is_never_written_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "keep").write_text("precious")
    _old(victim_dir / "keep")
    (cache / "logs").symlink_to(victim_dir)
    monkeypatch.setenv("EXTFORGE_CACHE", str(cache))
    # A link in place of the area is no folder of this user's: passed by for a private one.
    where = cli._crash_log(["build"], RuntimeError("boom"))
    assert Path(where).parent == cache / f"logs-{os.geteuid()}", where
    assert sorted(p.name for p in victim_dir.iterdir()) == ["keep"]
    # A real folder: the log is written, private to its user; a link at an old log's name is
    # no log of this user's: neither counted nor removed, its target untouched.
    (cache / "logs").unlink()
    (cache / "logs").mkdir()
    for i in range(cli.CRASH_LOGS_KEPT):
        (cache / "logs" / f"crash-2000010{i:02d}.log").symlink_to(victim_dir / "keep")
    where = cli._crash_log(["build"], RuntimeError("boom"))
    assert stat.S_IMODE(Path(where).stat().st_mode) == 0o600
    assert len(list((cache / "logs").iterdir())) == cli.CRASH_LOGS_KEPT + 1
    assert (victim_dir / "keep").read_text() == "precious"


def test_planted_logs_named_for_a_later_date_never_delete_the_real_crash_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The crash-log rotation kept the newest 20 names in `logs/`: links (or, as root, another
    user's files) named `crash-2099….log` planted there made every real log the oldest, deleted
    as soon as it was written, and the error line named a log that was gone."""
    cache = tmp_path / "cache"
    logs = cache / "logs"
    logs.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("theirs")
    for i in range(cli.CRASH_LOGS_KEPT + 5):
        (logs / f"crash-2099{i:04d}-000000-1.log").symlink_to(target)
    if os.geteuid() == 0:  # another user's regular files too
        for i in range(5):
            (logs / f"crash-2098{i:04d}-000000-1.log").write_text("theirs")
            os.chown(logs / f"crash-2098{i:04d}-000000-1.log", 65534, 65534)
    own = [logs / f"crash-2000{i:04d}-000000-1.log" for i in range(cli.CRASH_LOGS_KEPT)]
    for path in own:
        path.write_text("mine")
    planted = {p.name for p in logs.iterdir()} - {p.name for p in own}
    monkeypatch.setenv("EXTFORGE_CACHE", str(cache))
    where = Path(cli._crash_log(["build"], RuntimeError("boom")))
    assert where.parent == logs and "RuntimeError: boom" in where.read_text()
    # This user's newest 20 stay (the new one and 19 before it); what others put there stays.
    assert {p.name for p in logs.iterdir()} == planted | {where.name} | {p.name for p in own[1:]}
    assert target.read_text() == "theirs"
