"""Build PackageJobs with rattler-build through a content-addressed cache, and lay out the channel."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import stat
import time
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import cache, engine, paths, shared_read
from ..channel_ref import SUBDIRS
from ..errors import ExtforgeError
from ..locking import exclusive
from ..publishing.index import carry_fresh_entries, dated_after_its_packages, index_channel
from ..ui import log
from .conda_writer import write_package
from .recipes import PackageJob, render_recipe


@dataclass
class CachedPackage:
    name: str
    version: str
    build: str
    subdir: str
    path: Path  # the .conda file inside the cache
    cached: bool  # True when it was already there
    seconds: float


def package_cache_dir() -> Path:
    return paths.own_area("mirror") / "packages"


# What _build_miss writes: a repodata record (~1 KiB) and the names of one package file.
_ENTRY_LIMIT = 1 << 20
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]{0,250}\.(conda|tar\.bz2)")
_refused: set[Path] = set()


def _entry_fields(data: object) -> dict[str, Any]:
    """A package.json's fields, typed: four strings, the package's file name (no folder), its record."""
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    for field in ("name", "version", "build", "subdir", "file"):
        if not isinstance(data.get(field), str):
            raise ValueError(f"{field} is {shared_read.shown(data.get(field))}, not a string")
    if data["subdir"] not in SUBDIRS or not _FILE_NAME.fullmatch(data["file"]):
        raise ValueError(f"{shared_read.shown(data['subdir'] + '/' + data['file'])} is no package file of a subdir")
    if not isinstance(data.get("record", {}), dict):
        raise ValueError("its record is not a JSON object")
    return data


def _read_entry(entry: Path) -> dict[str, Any] | None:
    """The package.json of a cache entry; None where there is none, or one not as _build_miss
    writes it (said once: the package is built again over it)."""
    try:
        return shared_read.read_json(entry / "package.json", _entry_fields, limit=_ENTRY_LIMIT)
    except FileNotFoundError:
        return None
    except shared_read.Refused as exc:
        if exc.path not in _refused:
            _refused.add(exc.path)
            log.warning("%s; packaging it again", exc.what)
        return None


def lookup(job: PackageJob) -> CachedPackage | None:
    entry = package_cache_dir() / job.cache_key()
    data = _read_entry(entry)
    if data is None:
        return None
    pkg = entry / data["file"]
    if not pkg.is_file():
        return None
    paths.mark_used(entry)
    return CachedPackage(data["name"], data["version"], data["build"], data["subdir"], pkg, True, 0.0)


def build_job(job: PackageJob, log_file: Path | None = None, compression_threads: int | None = None) -> CachedPackage:
    """The cached package for `job`, building it with rattler-build on a miss."""
    hit = lookup(job)
    if hit:
        return hit
    key = job.cache_key()
    # Two mirrors sharing packages (rows of one python, a prefetch beside a mirror) build each
    # once: the work folder is per key, so a second builder would delete the first one's files.
    with exclusive(package_cache_dir().parent / "work" / f"{key}.lock"):
        return lookup(job) or _build_miss(job, key, log_file, compression_threads)


def _build_miss(job: PackageJob, key: str, log_file: Path | None, compression_threads: int | None) -> CachedPackage:
    start = time.monotonic()
    entry = package_cache_dir() / key
    work = entry.parent.parent / "work" / key
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if job.written_directly:
        built, record = _write_directly(job, work, compression_threads or 1)
    else:
        built, record = _build_with_rattler(job, work, log_file, compression_threads)
    entry.mkdir(parents=True, exist_ok=True)
    final = entry / built.name
    shutil.move(built, final)
    final.chmod(0o644)
    data = {
        "name": record["name"],
        "version": record["version"],
        "build": record["build"],
        "subdir": record["subdir"],
        "file": built.name,
        "record": record,
    }
    (entry / "package.json").write_text(json.dumps(data))
    shutil.rmtree(work, ignore_errors=True)
    return CachedPackage(
        record["name"], record["version"], record["build"], record["subdir"], final, False, time.monotonic() - start
    )


def _write_directly(job: PackageJob, work: Path, threads: int) -> tuple[Path, dict]:
    try:
        return write_package(job, work, threads)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ExtforgeError(
            f"could not package {job.name} {job.version} for the mirror",
            f"reading its files failed: {exc}",
            "check that the wheel or environment it comes from is still there and readable, then run the "
            "mirror again (packages already built are kept)",
        ) from exc


def _build_with_rattler(job: PackageJob, work: Path, log_file: Path | None,
                        compression_threads: int | None) -> tuple[Path, dict]:
    (work / "recipe").mkdir()
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(job.manifest))
    recipe = work / "recipe" / "recipe.yaml"
    recipe.write_text(render_recipe(job, manifest))
    out = work / "out"
    for sub in SUBDIRS:
        (out / sub).mkdir(parents=True, exist_ok=True)
    engine.prepare_environment()
    sink = engine.LogSink()
    try:
        # Our generated recipes need nothing from a channel; an explicit one keeps
        # rattler-build from reaching for conda-forge.
        results = engine.build_generated(recipe, out, [out.as_uri()], sink, package_format=job.package_format,
                                         compression_threads=compression_threads)
    except BaseException as exc:
        if not engine.engine_failure(exc):
            raise
        (work / "build.log").write_text("\n".join(sink.lines))
        raise ExtforgeError(
            f"could not package {job.name} {job.version} for the mirror",
            f"{engine.engine_message(exc)}{engine.panic_detail(exc, sorted((out / 'bld').glob('rattler-build_*')))}",
            f"read {work / 'build.log'}; the recipe is {recipe}",
        ) from exc
    if log_file:
        with log_file.open("a") as fh:
            fh.write(f"## {job.name} {job.version}\n" + "\n".join(sink.lines) + "\n")
    result = results[0]
    built = Path(result.packages[0])
    record = _built_record(built) or {}
    return built, {"name": result.name, "version": result.version, "build": result.build_string,
                   "subdir": result.platform} | record


def _built_record(built: Path) -> dict | None:
    """The repodata entry rattler-build wrote for the package when it indexed its output folder
    (sha256 and md5 of the whole file, read once already)."""
    try:
        return json.loads((built.parent / "repodata.json").read_text())["packages.conda"][built.name]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def seed_records(channel: Path, packages: list[CachedPackage]) -> int:
    """Give the channel's repodata.json the entries its packages got when they were built, so
    the indexer, which indexes only files it has no entry for, does not read ~3 GB of packages
    again. Returns how many entries were seeded.

    A file that is the cached package itself (one inode) gets its entry anew; the channel's other
    entries stay only while their files are unchanged since the repodata was written
    (carry_fresh_entries), and the repodata is then dated after its packages. Linking a package
    elsewhere (a package store, another channel) moves its ctime, which made every later run into
    this channel read all of its packages again (35 s for one torch row)."""
    seeded = 0
    for sub in sorted({p.subdir for p in packages}):
        live = channel / sub / "repodata.json"
        tmp = live.with_name(f".extforge-tmp-seed-{os.getpid()}")
        # carry_fresh_entries wrote tmp as an object of entries, or nothing where the repodata was damaged.
        if live.exists() and carry_fresh_entries(live.parent, tmp) is not None:
            data = json.loads(tmp.read_text())
        else:
            data = {"info": {"subdir": sub}, "packages": {}, "packages.conda": {}, "repodata_version": 1}
        entries = data.setdefault("packages.conda", {})
        for pkg in packages:
            placed = channel / sub / pkg.path.name
            if pkg.subdir != sub or not placed.is_file():
                continue
            if pkg.path.name in entries and not os.path.samefile(placed, pkg.path):
                continue  # a copy (another file system) indexed before: its entry was carried or it is read again
            record = (_read_entry(pkg.path.parent) or {}).get("record")
            if record and record.get("size") == pkg.path.stat().st_size:
                entries[pkg.path.name] = record
                seeded += 1
        tmp.write_text(json.dumps(data))
        tmp.replace(live)
        dated_after_its_packages(channel, sub)
    return seeded


# Each worker holds a package's files and buffers (~1-3 GB for torch); more than this many at
# once gains nothing on the local disk they all write to.
MAX_WORKERS = 4


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def build_jobs(jobs: Sequence[PackageJob], log_file: Path | None = None,
               on_package: Callable[[PackageJob, CachedPackage | None], None] | None = None,
               workers: int | None = None) -> list[CachedPackage]:
    """Every job's package, in the jobs' order: hits from the cache, misses built `workers` at a
    time, biggest first, each in a process of its own.

    One package's build is mostly one core's work (unzip, hash, compress), and rattler-build
    holds the GIL for parts of it, so threads would not overlap; processes keep every core busy.
    The cores left over compress (zstd threads)."""
    notify = on_package or (lambda job, pkg: None)
    found: dict[int, CachedPackage] = {}
    misses = []
    for i, job in enumerate(jobs):
        hit = lookup(job)
        if hit is None:
            misses.append(i)
            continue
        notify(job, None)
        found[i] = notify_done(notify, job, hit)
    if misses:
        cache.make_room(paths.cache_root(), f"packaging {len(misses)} package(s) for the mirror",
                        need=sum(jobs[i].size_hint for i in misses))
    cores = usable_cores()
    n = min(workers or min(cores, MAX_WORKERS), len(misses))
    if n <= 1:
        for i in misses:
            notify(jobs[i], None)
            found[i] = notify_done(notify, jobs[i], build_job(jobs[i], log_file, cores))
        return [found[i] for i in range(len(jobs))]
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
    try:
        running = {}
        for i in sorted(misses, key=lambda i: -jobs[i].size_hint):
            notify(jobs[i], None)
            running[pool.submit(build_job, jobs[i], log_file, max(1, cores // n))] = i
        for done in as_completed(running):
            i = running[done]
            try:
                found[i] = notify_done(notify, jobs[i], done.result())
            except BrokenProcessPool as exc:
                raise ExtforgeError(
                    f"a packaging process died while packaging {jobs[i].name} {jobs[i].version} for the mirror",
                    "it ended without an error of its own (killed, or out of memory)",
                    "run the mirror again (packages already built are kept); if it recurs, check `dmesg` for the OOM killer",
                ) from exc
    finally:
        pool.shutdown(cancel_futures=True)
    return [found[i] for i in range(len(jobs))]


def notify_done(notify: Callable[[PackageJob, CachedPackage | None], None], job: PackageJob,
                pkg: CachedPackage) -> CachedPackage:
    notify(job, pkg)
    return pkg


def place(packages: list[CachedPackage], channel: Path, remove: set[str] = frozenset()) -> list[Path]:  # type: ignore[assignment]
    """Link (or copy) the packages into `channel`, drop `remove` (files "<subdir>/<name>" no
    longer mirrored) unless wanted again, index it."""
    channel.mkdir(parents=True, exist_ok=True)
    wanted: dict[Path, Path] = {}
    for pkg in packages:
        wanted[channel / pkg.subdir / pkg.path.name] = pkg.path
    for sub in SUBDIRS:
        (channel / sub).mkdir(exist_ok=True)
    for rel in sorted(remove):
        old = channel / rel
        if old not in wanted and old.is_file():
            log.info("removing %s from the channel (no longer mirrored)", old.name)
            old.unlink()
    placed = []
    for dst, src in wanted.items():
        if not (dst.exists() and os.path.samefile(dst, src)):
            if dst.exists():
                dst.unlink()
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        if stat.S_IMODE(dst.stat().st_mode) != 0o644:
            dst.chmod(0o644)  # only then: a chmod moves the ctime, and the index reads a moved file again
        placed.append(dst)
    seed_records(channel, packages)
    index_channel(channel)
    return placed
