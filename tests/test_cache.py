"""`extforge cache`: sizes per area with hard links counted once, and --prune removing exactly the
entries that went unused, on a real folder tree, through the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge import cache, paths
from extforge.mirror.builder import lookup
from extforge.mirror.inputs import share_wheels
from extforge.mirror.recipes import PackageJob

DAY = 24 * 3600
MIB = 2**20


def _entry(folder: Path, name: str, size: int, age_days: float) -> Path:
    entry = folder / name
    entry.mkdir(parents=True)
    (entry / "blob").write_bytes(os.urandom(size))
    old = time.time() - age_days * DAY
    os.utime(entry, (old, old))
    return entry


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EXTFORGE_CACHE": str(root)}
    return run_extforge("cache", *args, env=env)


def _tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "cache"
    got = {
        "old_pkg": _entry(root / "mirror" / "packages", "aaaa", MIB, 30),
        "new_pkg": _entry(root / "mirror" / "packages", "bbbb", MIB, 1),
        "old_wheel": _entry(root / "mirror" / "wheel-store", "cccc", 2 * MIB, 30),
        "old_env": _entry(root / "audit-targets", "dddd", MIB, 30),
    }
    # A request folder hard-links its wheel from the store: the same bytes, counted once.
    request = root / "mirror" / "wheels" / "eeee"
    request.mkdir(parents=True)
    os.link(got["old_wheel"] / "blob", request / "torch.whl")
    (root / "audit-targets" / "dddd.lock").write_text("")
    got["lock"] = root / "audit-targets" / "dddd.lock"
    got["request"] = request
    got["root"] = root
    return got


def test_sizes_count_a_hard_linked_file_once(tmp_path: Path):
    t = _tree(tmp_path)
    entries = list(cache.scan(t["root"]))
    by_path = {e.path: e for e in entries}
    assert t["lock"] not in by_path  # a lock is not an entry
    assert by_path[t["old_wheel"]].bytes >= 2 * MIB
    assert by_path[t["request"]].bytes < MIB  # its wheel was counted under the store
    total = sum(e.bytes for e in entries)
    assert 5 * MIB <= total < 6 * MIB


def test_prune_removes_only_what_went_unused_and_dry_run_nothing(tmp_path: Path):
    t = _tree(tmp_path)
    dry = _cli(t["root"], "--prune", "7", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert sorted(r["path"] for r in doc["removed"]) == sorted(str(t[k]) for k in ("old_env", "old_pkg", "old_wheel"))
    assert all(t[k].exists() for k in ("old_pkg", "old_wheel", "old_env"))
    # The old wheel stays on disk through the request folder's link: only the package and env free space.
    assert 2 * MIB <= doc["frees_bytes"] < 3 * MIB
    assert {r["area"]: r["pruned_bytes"] for r in doc["areas"]}["mirror-wheels"] == 0

    done = _cli(t["root"], "--prune", "7")
    assert done.returncode == 0, done.stderr
    assert "removed 3 entries unused for 7 days" in done.stderr
    assert not any(t[k].exists() for k in ("old_pkg", "old_wheel", "old_env"))
    assert t["new_pkg"].exists() and t["request"].exists() and t["lock"].exists()
    # The request folder still holds its wheel: the store's copy went, the bytes did not.
    assert (t["request"] / "torch.whl").stat().st_size == 2 * MIB
    assert not list(t["root"].rglob(".pruning-*"))


def test_prune_of_one_area_leaves_the_others(tmp_path: Path):
    t = _tree(tmp_path)
    done = _cli(t["root"], "--prune", "7", "--area", "audit-targets", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["path"] for r in json.loads(done.stdout)["removed"]] == [str(t["old_env"])]
    assert t["old_pkg"].exists() and t["old_wheel"].exists()


def test_what_an_interrupted_prune_left_goes_with_the_next(tmp_path: Path):
    t = _tree(tmp_path)
    left = t["root"] / "mirror" / "packages" / ".pruning-ffff-123"
    left.mkdir()
    (left / "blob").write_bytes(b"x")
    done = _cli(t["root"], "--prune", "365")
    assert done.returncode == 0, done.stderr
    assert not left.exists() and t["old_pkg"].exists()


def test_bad_arguments_are_refused_with_the_fix(tmp_path: Path):
    t = _tree(tmp_path)
    for args, words in ((["--area", "nope"], "mirror-packages"), (["--prune", "-1"], "--prune 0"),
                        (["--dry-run"], "add --prune DAYS")):
        proc = _cli(t["root"], *args)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert t["old_pkg"].exists()


def test_reusing_a_mirror_package_or_wheel_marks_it_used(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    job = PackageJob(name="demo", version="1", build_string="0", identity="x")
    entry = _entry(paths.cache_root() / "mirror" / "packages", job.cache_key(), 10, 30)
    (entry / "demo-1-0.conda").write_bytes(b"pkg")
    (entry / "package.json").write_text(json.dumps({"name": "demo", "version": "1", "build": "0",
                                                    "subdir": "noarch", "file": "demo-1-0.conda"}))
    os.utime(entry, (time.time() - 30 * DAY,) * 2)
    assert lookup(job) is not None
    assert time.time() - entry.stat().st_mtime < DAY

    store, request = tmp_path / "store", tmp_path / "request"
    request.mkdir()
    (request / "w-1-py3-none-any.whl").write_bytes(b"wheel")
    digests = {"w-1-py3-none-any.whl": hashlib.sha256(b"wheel").hexdigest()}
    share_wheels(request, store, digests)
    (kept,) = store.iterdir()
    os.utime(kept, (time.time() - 30 * DAY,) * 2)
    share_wheels(request, store, digests)  # already linked: only marked
    assert time.time() - kept.stat().st_mtime < DAY


def test_every_folder_the_code_writes_under_the_cache_is_an_area():
    """Each folder the project (code, tests, benches, calibration and node tools) joins onto cache_root() is listed by
    `extforge cache`: a folder it does not list is disk a user cannot see or prune."""
    import fnmatch
    import re

    repo = Path(__file__).resolve().parents[1]
    pattern = re.compile(r'cache_root\(\) / f?"([^"{]+)(\{[^"]*)?"(?: / "([^"{]+)")?')
    # A user's own folders: <name> (or <name>-<uid>, in another user's cache root), <name>-<uid>.
    per_user = re.compile(r'\b(own_area|private_dir)\("([^"]+)"')
    written = set()
    for path in [*repo.glob("src/**/*.py"), *repo.glob("tests/**/*.py"), *repo.glob("bench/*.py"),
                 *repo.glob("calibration/*.py"), *repo.glob("node/**/*.py")]:
        text = path.read_text()
        for top, templated, sub in pattern.findall(text):
            written.add(top + ("*" if templated else "") + (f"/{sub}" if sub else ""))
        for kind, name in per_user.findall(text):
            written |= {f"{name}-*"} | ({name} if kind == "own_area" else set())
    assert {"trust-*", "mirror-*", "toolkits-*", "audit-targets-*", "audit-torch", "tools", "logs"} <= written, written
    rels = [a.rel for a in cache.AREAS]
    unlisted = {w for w in written
                if not any(fnmatch.fnmatch(w, rel) or w.startswith(rel + "/") or rel.startswith(w + "/")
                           or ("/" in rel and fnmatch.fnmatch(w, rel.split("/", 1)[0])) for rel in rels)}
    assert not unlisted, f"cache folders no area lists: {unlisted}"


def test_private_and_self_managed_areas_are_listed_but_never_pruned(tmp_path: Path):
    t = _tree(tmp_path)
    secret = _entry(t["root"] / f"trust-{os.getuid()}", "secret", 10, 30)
    objects = _entry(t["root"] / "compile", "a", 10, 30)
    listed = json.loads(_cli(t["root"], "--json").stdout)
    assert {r["area"]: r["entries"] for r in listed["areas"]}.items() >= {"trust": 1, "compile": 1}.items()
    done = _cli(t["root"], "--prune", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert secret.exists() and objects.exists() and not t["old_pkg"].exists()
    refused = _cli(t["root"], "--prune", "0", "--area", "trust")
    assert refused.returncode == 2 and "cannot be pruned" in refused.stderr and "Traceback" not in refused.stderr
    assert secret.exists()


def _candidates(t: dict[str, Path], *keys: str) -> list[cache.Entry]:
    by_path = {e.path: e for e in cache.scan(t["root"])}
    return [by_path[t[k]] for k in keys]


def test_eviction_keeps_an_entry_linked_from_elsewhere_and_stops_when_enough_is_freed(tmp_path: Path):
    t = _tree(tmp_path)
    # The old wheel's bytes are also the request folder's (not a candidate): removing it frees
    # nothing, so the next entry in LRU order goes instead.
    plan, freed = cache.eviction_plan(_candidates(t, "old_pkg", "old_wheel", "old_env", "new_pkg"), int(1.5 * MIB))
    assert [e.path for e in plan] == [t["old_pkg"], t["old_env"]]
    assert 2 * MIB <= freed < 3 * MIB
    # With the request a candidate too, the pair goes together once both are in the run.
    plan, freed = cache.eviction_plan(_candidates(t, "old_pkg", "old_env", "old_wheel", "request", "new_pkg"), int(3.5 * MIB))
    assert [e.path for e in plan] == [t["old_pkg"], t["old_env"], t["old_wheel"], t["request"]]
    assert 4 * MIB <= freed < 5 * MIB
    # Enough after the first: nothing more is touched.
    plan, _ = cache.eviction_plan(_candidates(t, "old_pkg", "old_env", "new_pkg"), MIB // 2)
    assert [e.path for e in plan] == [t["old_pkg"]]


def test_an_entry_whose_package_a_channel_links_stays_though_its_small_record_is_its_own(tmp_path: Path):
    # A mirror entry is its .conda and a package.json; a channel links the .conda. Removing the
    # entry would give back the record's few KiB and make the next mirror build the package
    # again (a cold suite on a short disk lost row A's two largest packages so).
    root = tmp_path / "cache"
    linked, alone = (_entry(root / "mirror" / "packages", key, MIB, 30) for key in ("aaaa", "bbbb"))
    for entry in (linked, alone):
        (entry / "package.json").write_text("{}" * 2048)
        os.utime(entry, (time.time() - 30 * DAY,) * 2)
    channel = tmp_path / "channel"
    channel.mkdir()
    os.link(linked / "blob", channel / "pkg.conda")
    by_path = {e.path: e for e in cache.scan(root)}
    plan, freed = cache.eviction_plan([by_path[linked], by_path[alone]], 4 * MIB)
    assert [e.path for e in plan] == [alone] and MIB <= freed < 2 * MIB


def test_make_room_removes_the_unused_least_recently_used_entries_and_says_so(tmp_path: Path, monkeypatch, caplog):
    t = _tree(tmp_path)
    in_use = _entry(t["root"] / "audit-targets", "ffff", MIB, 10 / (24 * 60))  # used 10 minutes ago
    secret = _entry(t["root"] / f"trust-{os.getuid()}", "secret", 10, 30)
    monkeypatch.setenv(cache.MIN_FREE_ENV, "0")
    assert cache.make_room(t["root"], "a test", need=2**60) is None  # 0: off, whatever the need
    assert t["old_pkg"].exists()

    # More than any disk has: every entry that frees space and is not in use goes, oldest first.
    monkeypatch.setenv(cache.MIN_FREE_ENV, "1e9")
    with caplog.at_level("WARNING", logger="extforge"):
        room = cache.make_room(t["root"], "a test")
    assert room is not None
    assert {e.path for e in room.removed} == {t["old_pkg"], t["old_env"], t["new_pkg"]}
    assert not any(t[k].exists() for k in ("old_pkg", "old_env", "new_pkg"))
    # Kept: used less than half an hour ago (a run in progress: the request folder too), a
    # private area, and the old wheel, whose bytes the request folder still links.
    assert in_use.exists() and secret.exists() and t["request"].exists() and t["old_wheel"].exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "before a test ($EXTFORGE_CACHE_MIN_FREE: at least" in message and "removed 3 cache entries" in message
    assert "mirror-packages 2" in message and "still short" in message


def test_a_bad_min_free_is_refused_with_the_fix(tmp_path: Path, monkeypatch):
    t = _tree(tmp_path)
    for bad in ("twenty", "-5", "nan"):
        monkeypatch.setenv(cache.MIN_FREE_ENV, bad)
        proc = _cli(t["root"])
        assert proc.returncode == 2 and "EXTFORGE_CACHE_MIN_FREE=20" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_pruning_never_removes_a_published_channel(tmp_path: Path, monkeypatch, caplog):
    """A channel published under the cache (scripts/demo's mirror in `channels/`) was an area
    like any other: room-making on a short disk and `cache --prune` deleted it, naming nothing,
    and every env that installs from it broke."""
    t = _tree(tmp_path)
    channel = _entry(t["root"] / "channels", "mirror-torch2.14.1", MIB, 30)
    (channel / "noarch").mkdir()
    (channel / "noarch" / "repodata.json").write_text("{}")
    os.utime(channel, (time.time() - 30 * DAY,) * 2)
    monkeypatch.setenv(cache.MIN_FREE_ENV, "1e9")
    with caplog.at_level("WARNING", logger="extforge"):
        room = cache.make_room(t["root"], "a test")
    assert room is not None and channel.is_dir() and not t["old_pkg"].exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "kept: the published channel(s) mirror-torch2.14.1 in" in message and "never removed" in message, message
    done = _cli(t["root"], "--prune", "0")
    assert done.returncode == 0 and channel.is_dir(), done.stderr
    assert "channels" in done.stderr and "listed only, never pruned" in done.stderr.split("channels", 1)[1].splitlines()[0]
    refused = _cli(t["root"], "--prune", "0", "--area", "channels")
    assert refused.returncode == 2 and "cannot be pruned by age" in refused.stderr and channel.is_dir()


def test_a_prune_of_nan_or_infinite_days_is_refused(tmp_path: Path):
    """`--prune nan` and `--prune inf` were taken: no entry's age compares with them, so the
    prune removed nothing and said it removed 0 entries unused for nan days."""
    t = _tree(tmp_path)
    for bad in ("nan", "inf", "Infinity"):
        proc = _cli(t["root"], "--prune", bad)
        assert proc.returncode == 2 and f"--prune {bad} is not a number of days" in proc.stderr, proc.stderr
        assert "pass --prune 0" in proc.stderr and "Traceback" not in proc.stderr
    assert t["old_pkg"].exists()


def test_the_trust_folder_is_found_once_a_process_and_checked_again_at_each_use(tmp_path: Path, monkeypatch):
    """An install signs or reads a record of the trust folder several hundred times (61 packages:
    about 550). The old code listed the cache root, stat'ed its file system (statfs: a round trip
    on a network file system, the node's /tmp) and read the secret at every one of them: 30
    lookups here made 30 listings and 30 statfs calls. Now one of each; a folder that is no
    longer the one found (removed, made again) or no longer private is not believed from memory."""
    from extforge.environment import trust
    from extforge.errors import ExtforgeError

    (tmp_path / "site-cache").mkdir()
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "site-cache"))
    calls = {"listdir": 0, "statvfs": 0}

    def counted(name: str):
        real = getattr(os, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    for name in calls:
        monkeypatch.setattr(os, name, counted(name))
    signed = trust.sign({"n": 1})
    for _ in range(30):
        assert trust.verify_signed(signed) == {"n": 1}
    assert calls == {"listdir": 1, "statvfs": 1}

    found = trust.trust_dir()
    found.chmod(0o770)
    with pytest.raises(ExtforgeError, match="not drwx------"):
        trust.trust_dir()
    found.chmod(0o700)
    assert trust.verify_signed(signed) == {"n": 1}

    # Made again: a new secret, and what the old one signed is not believed.
    for child in found.iterdir():
        child.unlink()
    found.rmdir()
    assert trust.verify_signed(signed) is None
    assert trust.trust_dir() == found and trust.verify_signed(trust.sign({"n": 2})) == {"n": 2}
