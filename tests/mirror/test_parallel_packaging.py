"""The mirror packages several packages at once, each in a process of its own, and hands them
back in the jobs' order: real rattler-build builds of small generated packages."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.mirror.builder import build_jobs
from extforge.mirror.recipes import PackageJob


def _job(name: str, size: int) -> PackageJob:
    return PackageJob(name=name, version="1.0", build_string="h${{ hash }}_0", identity=name, size_hint=size,
                      manifest={"texts": [[f"share/{name}.txt", f"{name}\n" * size, "644"]]})


def test_packages_built_at_once_come_back_in_order_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    jobs = [_job("small", 10), _job("big", 1000), _job("middle", 100)]
    events: list[tuple[str, bool]] = []
    built = build_jobs(jobs, tmp_path / "log", lambda job, pkg: events.append((job.name, pkg is not None)), workers=2)
    assert [p.name for p in built] == ["small", "big", "middle"]
    assert not any(p.cached for p in built)
    # The biggest starts first; every package is announced, then reported done, once.
    assert events[0] == ("big", False)
    assert sorted(events) == sorted([(j.name, False) for j in jobs] + [(j.name, True) for j in jobs])
    for pkg, job in zip(built, jobs, strict=True):
        with zipfile.ZipFile(pkg.path) as zf:
            assert any(n.startswith(f"pkg-{job.name}-") for n in zf.namelist())
    assert "## big 1.0" in (tmp_path / "log").read_text()

    again = build_jobs(jobs, None, None, workers=2)
    assert [p.path for p in again] == [p.path for p in built] and all(p.cached for p in again)


def test_a_failing_package_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    bad = _job("bad", 1)
    bad.manifest = {"files": [[str(tmp_path / "missing.so"), "lib/missing.so", ""]]}
    with pytest.raises(ExtforgeError) as err:
        build_jobs([_job("good", 1), bad], None, None, workers=2)
    assert "could not package bad 1.0" in str(err.value) and err.value.fix
    meta = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "mirror" / "packages").glob("*/package.json")]
    assert [m["name"] for m in meta] in ([], ["good"])  # what was built stays cached


def test_the_channel_index_reuses_the_records_written_at_build_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Placing packages does not read them again: their repodata entries are the ones rattler-build
    wrote when it built them (sha256 and md5 of the very file), and the indexer keeps them."""
    import hashlib

    from extforge.mirror.builder import place

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    built = build_jobs([_job("one", 10), _job("two", 10)], None, None, workers=1)
    meta = built[1].path.parent / "package.json"
    marked = json.loads(meta.read_text())
    assert marked["record"]["sha256"] == hashlib.sha256(built[1].path.read_bytes()).hexdigest()
    marked["record"]["md5"] = "0" * 32  # a value the indexer would never compute
    meta.write_text(json.dumps(marked))
    place(built, tmp_path / "channel")
    entries = json.loads((tmp_path / "channel" / built[1].subdir / "repodata.json").read_text())["packages.conda"]
    assert entries[built[1].path.name]["md5"] == "0" * 32
    assert entries[built[0].path.name]["sha256"] == hashlib.sha256(built[0].path.read_bytes()).hexdigest()


def test_two_processes_asking_for_one_package_build_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A mirror beside another (the test session's background seed rows and a fixture) sharing a
    package: the second waits for the first's build and takes it from the cache, instead of
    deleting the first one's work folder under it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from extforge.mirror.builder import build_job

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    job = _job("shared", 20000)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        first, second = pool.map(build_job, [job, job])
    assert first.path == second.path and first.path.is_file()
    assert sorted([first.cached, second.cached]) == [False, True]


def test_placing_a_row_again_keeps_the_packages_ctime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A warm mirror places the same files again; their ctime must stay, or the index takes them
    for rewritten packages and reads them all again (a torch row: ~3 GB each warm run)."""
    import time

    from extforge.mirror import builder as mirror_channel

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    built = build_jobs([_job("one", 10)], None, None, workers=1)
    monkeypatch.setattr(mirror_channel, "index_channel", lambda channel: None)  # the index's own links aside
    (placed,) = mirror_channel.place(built, tmp_path / "channel")
    before = placed.stat().st_ctime_ns
    time.sleep(0.05)  # past the filesystem clock's tick
    mirror_channel.place(built, tmp_path / "channel")
    assert placed.stat().st_ctime_ns == before


def test_a_package_linked_elsewhere_is_not_read_again_and_another_rows_changed_file_is(tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch):
    """A mirror run into a channel whose packages were linked elsewhere since (a package store,
    a test's channel: each link moves the file's ctime) keeps their entries from the build
    records instead of reading every package again (a torch row: 35 s, now ~1 s); another row's
    entries stay while their files are unchanged, and a file rewritten since is read again."""
    import hashlib
    import os
    import time

    from extforge.mirror.builder import place

    def mark(pkg, md5: str) -> None:  # a value only the build record holds; an index of the file would not
        meta = pkg.path.parent / "package.json"
        marked = json.loads(meta.read_text())
        marked["record"]["md5"] = md5
        meta.write_text(json.dumps(marked))

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    channel = tmp_path / "channel"
    one, other, kept = build_jobs([_job("one", 10), _job("other", 10), _job("kept", 10)], None, None, workers=1)
    mark(other, "1" * 32)
    mark(kept, "2" * 32)
    place([one, other, kept], channel)
    time.sleep(0.05)  # past the filesystem clock's tick
    os.link(one.path, tmp_path / "elsewhere.conda")
    mark(one, "0" * 32)
    replaced = channel / other.subdir / other.path.name
    content = replaced.read_bytes()
    replaced.unlink()
    replaced.write_bytes(content)  # the other row's file, written anew since the index
    place([one], channel)
    entries = json.loads((channel / one.subdir / "repodata.json").read_text())["packages.conda"]
    assert entries[one.path.name]["md5"] == "0" * 32
    assert entries[other.path.name]["md5"] == hashlib.md5(content).hexdigest()
    assert entries[kept.path.name]["md5"] == "2" * 32  # another row's unchanged file: its entry carried, not read
