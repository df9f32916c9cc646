"""Build PackageJobs with rattler-build through a content-addressed cache, and lay out the channel."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..build import engine_failure, engine_message, panic_detail, prepare_rattler_environment
from ..errors import ExtforgeError
from ..ui import log
from .recipes import PackageJob, render_recipe

SUBDIRS = ("linux-64", "noarch")


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
    return paths.cache_root() / "mirror" / "packages"


def lookup(job: PackageJob) -> CachedPackage | None:
    entry = package_cache_dir() / job.cache_key()
    meta = entry / "package.json"
    if not meta.is_file():
        return None
    data = json.loads(meta.read_text())
    pkg = entry / data["file"]
    if not pkg.is_file():
        return None
    return CachedPackage(data["name"], data["version"], data["build"], data["subdir"], pkg, True, 0.0)


def build_job(job: PackageJob, log_file: Path | None = None) -> CachedPackage:
    """The cached package for `job`, building it with rattler-build on a miss."""
    hit = lookup(job)
    if hit:
        return hit
    from rattler_build import Stage0Recipe, ToolConfiguration

    start = time.monotonic()
    key = job.cache_key()
    entry = package_cache_dir() / key
    work = paths.cache_root() / "mirror" / "work" / key
    shutil.rmtree(work, ignore_errors=True)
    (work / "recipe").mkdir(parents=True)
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(job.manifest))
    recipe = work / "recipe" / "recipe.yaml"
    recipe.write_text(render_recipe(job, manifest))
    out = work / "out"
    for sub in SUBDIRS:
        (out / sub).mkdir(parents=True, exist_ok=True)
    prepare_rattler_environment()
    logs: list[str] = []

    class _Log:
        def on_log(self, event) -> None:  # rattler-build's ProgressCallback protocol
            logs.append(f"{event.level}: {event.message}")

    try:
        results = Stage0Recipe.from_file(recipe).run_build(
            output_dir=out,
            # Our generated recipes need nothing from a channel; an explicit one keeps
            # rattler-build from reaching for conda-forge.
            channels=[out.as_uri()],
            tool_config=ToolConfiguration(test_strategy="skip"),
            package_format=job.package_format,
            no_include_recipe=True,
            progress_callback=_Log(),
        )
    except BaseException as exc:
        if not engine_failure(exc):
            raise
        (work / "build.log").write_text("\n".join(logs))
        raise ExtforgeError(
            f"could not package {job.name} {job.version} for the mirror",
            f"{engine_message(exc)}{panic_detail(exc, sorted((out / 'bld').glob('rattler-build_*')))}",
            f"read {work / 'build.log'}; the recipe is {recipe}",
        ) from exc
    if log_file:
        with log_file.open("a") as fh:
            fh.write(f"## {job.name} {job.version}\n" + "\n".join(logs) + "\n")
    result = results[0]
    built = Path(result.packages[0])
    entry.mkdir(parents=True, exist_ok=True)
    final = entry / built.name
    shutil.move(built, final)
    final.chmod(0o644)
    data = {
        "name": result.name,
        "version": result.version,
        "build": result.build_string,
        "subdir": result.platform,
        "file": built.name,
    }
    (entry / "package.json").write_text(json.dumps(data))
    shutil.rmtree(work, ignore_errors=True)
    return CachedPackage(
        result.name, result.version, result.build_string, result.platform, final, False, time.monotonic() - start
    )


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
        dst.chmod(0o644)
        placed.append(dst)
    index_channel(channel)
    return placed


def index_channel(channel: Path) -> None:
    """Write repodata.json for every subdir, readable by everyone (a shared channel is served as is)."""
    from ..channel.index import reindex

    for sub in SUBDIRS:
        (channel / sub).mkdir(parents=True, exist_ok=True)
    reindex(channel)
    for sub in SUBDIRS:
        for f in (channel / sub).iterdir():
            if f.is_file():
                f.chmod(0o644)
