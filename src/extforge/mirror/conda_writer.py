"""Write a repackaged Python distribution straight into a `.conda` file, in one pass.

rattler-build stages a package's files into a prefix, scans every byte of them for the prefix,
hashes them, copies them into its packaging folder and compresses them: for torch's 5 GB of
wheel payload that is ~3x the CPU of unzipping, hashing and compressing it once. A distribution
needs none of its other work: its files are never relinked (`relocate=False`), and the only ones
that name the prefix are those the mirror itself writes (scripts' shebangs, console scripts),
so it knows them without a scan. This module streams each wheel member (or installed file) into
the package's tarball while hashing it; packages that do need rattler-build (the interpreter,
CUDA toolkits, symlinks, relocation) still go through it (`PackageJob.written_directly`).

Where files land and how shebangs are rewritten is `_stage.py`'s rule, the one the rattler-build
path runs, so both writers give the same files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import zstandard
from rattler import Subdir

from ..errors import ExtforgeError
from ..hashing import digests_file
from ._stage import compile_bytecode, rewrite_shebang, wheel_member_target
from .recipes import PackageJob, exact_self_pin

# What the files that name the prefix hold in the package; the installer puts the real prefix in.
# Long, as conda-build's, so that no real path starts with it by chance.
PLACEHOLDER = "/opt/extforge_mirror_env_" + "placehold_" * 14


def render_build_string(job: PackageJob) -> str:
    """The build string with `${{ hash }}` filled from the job's cache key (7 hex digits, the
    length rattler-build gives its own hash)."""
    return job.build_string.replace("${{ hash }}", job.cache_key()[:7])


@dataclass(frozen=True)
class _Member:
    """One file of the package: where it comes from and what it becomes."""

    path: str  # relative to the prefix
    mode: int
    size: int = 0  # of the source (a shebang rewritten or a generated text has its own)
    wheel: int | None = None  # index into the job's wheels, with `member`
    member: str = ""
    src: str = ""  # an installed file
    text: bytes | None = None  # generated content
    shebang: bool = False  # point a python shebang at the package's python


def _packaged_mode(mode: int) -> int:
    """rattler-build's rule: readable by all, executable by all when executable at all."""
    return 0o755 if mode & 0o111 else 0o644


def _members(job: PackageJob, zips: list[zipfile.ZipFile]) -> list[_Member]:
    """Every file in the order _stage.py writes them; a later one replaces an earlier one at the
    same path, as it does there."""
    m = job.manifest
    python = bool(m.get("python"))
    out: dict[str, _Member] = {}
    for i, (w, zf) in enumerate(zip(m.get("wheels", []), zips, strict=True)):
        for info in zf.infolist():
            rel = wheel_member_target(info.filename, w["data_dir"], w["site"], w["include"])
            if rel is None:
                continue
            mode = (info.external_attr >> 16) & 0o777
            script = rel.startswith("bin/") and python
            out[rel] = _Member(rel, _packaged_mode(mode | 0o755 if script else mode), info.file_size, wheel=i,
                               member=info.filename, shebang=script)
    for src, dst, flags in m.get("files", []):
        st = os.stat(src)
        out[dst] = _Member(dst, _packaged_mode(st.st_mode), st.st_size, src=src, shebang="s" in flags and python)
    for dst, content, mode in m.get("texts", []):
        out[dst] = _Member(dst, _packaged_mode(int(mode, 8)), text=content.replace("@PREFIX@", PLACEHOLDER).encode())
    return [out[k] for k in sorted(out)]


def _licenses(job: PackageJob, zips: list[zipfile.ZipFile]) -> list[_Member]:
    """The distribution's licence files (licenses.py found them), as info/licenses/ members."""
    m = job.manifest
    out = [_Member(f"info/licenses/{name}", 0o644, zips[i].getinfo(member).file_size, wheel=i, member=member)
           for i, w in enumerate(m.get("wheels", [])) for member, name in w.get("licenses", [])]
    out += [_Member(f"info/licenses/{name}", 0o644, os.stat(src).st_size, src=src) for src, name in m.get("license_files", [])]
    return out


def _compiled(job: PackageJob, members: list[_Member], zips: list[zipfile.ZipFile], staging: Path) -> list[_Member]:
    """The .pyc of the package's modules (recipes.bytecode_spec), compiled in `staging` from the
    bytes the package carries."""
    for member in members:
        if member.path.startswith("lib/python3") and member.path.endswith(".py") and member.text is None \
                and not member.shebang:
            dest = staging / member.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _open(member, zips) as raw, dest.open("wb") as out:
                shutil.copyfileobj(raw, out)
    spec = job.manifest["bytecode"]
    try:
        written = compile_bytecode(spec, str(staging), root_is_prefix=False)
    except (OSError, RuntimeError) as exc:
        raise ExtforgeError(
            f"could not package {job.name} {job.version} for the mirror",
            f"its modules' byte code could not be compiled: {exc}",
            f"check that {spec['python']} (the python of this mirror's row) still runs, then run the mirror "
            "again (packages already built are kept)",
        ) from exc
    return [_Member(rel, 0o644, (staging / rel).stat().st_size, src=str(staging / rel)) for rel in written]


class _HashingReader:
    """Hands tarfile a source's bytes while hashing them."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        return data


def _open(member: _Member, zips: list[zipfile.ZipFile]) -> IO[bytes]:
    if member.text is not None:
        return io.BytesIO(member.text)
    if member.wheel is not None:
        return zips[member.wheel].open(member.member)
    return open(member.src, "rb")


def _add_members(tar: tarfile.TarFile, job: PackageJob, members: list[_Member], zips: list[zipfile.ZipFile],
                 mtime: int) -> Iterator[dict]:
    """Write every member into `tar`; yields each one's info/paths.json entry."""
    python = f"{PLACEHOLDER}/{job.manifest['python']}" if job.manifest.get("python") else ""
    for member in members:
        with _open(member, zips) as raw:
            if member.shebang or member.text is not None:
                data = raw.read()
                if member.shebang:
                    data = rewrite_shebang(data, python)
                source: IO[bytes] = io.BytesIO(data)
                size = len(data)
                names_prefix = PLACEHOLDER.encode() in data
            else:
                source = raw
                size = member.size
                names_prefix = False
            info = tarfile.TarInfo(member.path)
            info.size, info.mode, info.mtime = size, member.mode, mtime
            reader = _HashingReader(source)
            tar.addfile(info, reader)
        entry = {"_path": member.path, "path_type": "hardlink", "sha256": reader.sha.hexdigest(), "size_in_bytes": size}
        if names_prefix:
            entry |= {"file_mode": "text", "prefix_placeholder": PLACEHOLDER}
        yield entry


def _index(job: PackageJob, build: str, timestamp_ms: int) -> dict:
    platform = Subdir.current()
    index = {
        "arch": str(platform.arch),
        "build": build,
        "build_number": job.build_number,
        "depends": job.depends,
        "license": job.about_license,
        "name": job.name,
        "platform": platform.only_platform,
        "subdir": str(platform),
        "timestamp": timestamp_ms,
        "version": job.version,
    }
    if job.constrains:
        index["constrains"] = job.constrains
    return index


def _json_member(tar: tarfile.TarFile, name: str, value: object, mtime: int) -> None:
    data = (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, mtime
    tar.addfile(info, io.BytesIO(data))


@contextlib.contextmanager
def _tar_zst(zout: zipfile.ZipFile, name: str, level: int, threads: int, mtime: int) -> Iterator[tarfile.TarFile]:
    """A tarball streamed through zstd into the member `name` of the package's zip."""
    with zout.open(zipfile.ZipInfo(name, time.localtime(mtime)[:6]), "w", force_zip64=True) as raw:
        # zstd's threads=0 is its single-threaded mode (1 would add a worker beside this thread).
        with zstandard.ZstdCompressor(level=level, threads=threads if threads > 1 else 0).stream_writer(
                raw, closefd=False) as writer, tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            yield tar


def write_package(job: PackageJob, out_dir: Path, threads: int = 1) -> tuple[Path, dict]:
    """Write `job`'s package into `out_dir`; returns its path and its repodata record (the
    fields of info/index.json plus the whole file's size, sha256 and md5)."""
    build = render_build_string(job)
    stem = f"{job.name}-{job.version}-{build}"
    now = time.time()
    mtime = int(now)
    index = _index(job, build, int(now * 1000))
    out = out_dir / f"{stem}.conda"
    # An exact self-pin (recipes.exact_self_pin) as rattler-build renders it: version and build string.
    weak = [f"{job.name} =={job.version} {build}" if e == exact_self_pin(job.name) else e for e in job.run_exports]
    exports = {k: v for k, v in (("weak", weak), ("strong", job.strong_run_exports)) if v}
    zips = [zipfile.ZipFile(w["path"]) for w in job.manifest.get("wheels", [])]
    staging = out_dir / "bytecode"
    try:
        members = _members(job, zips)
        if job.manifest.get("bytecode"):
            members = sorted(members + _compiled(job, members, zips, staging), key=lambda m: m.path)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
            zout.writestr(zipfile.ZipInfo("metadata.json", time.localtime(mtime)[:6]),
                          '{"conda_pkg_format_version":2}')
            with _tar_zst(zout, f"pkg-{stem}.tar.zst", job.zstd_level, threads, mtime) as tar:
                paths = list(_add_members(tar, job, members, zips, mtime))
            with _tar_zst(zout, f"info-{stem}.tar.zst", job.zstd_level, 1, mtime) as tar:
                _json_member(tar, "info/about.json", {"license": index["license"], "summary": job.about_summary}, mtime)
                _json_member(tar, "info/index.json", index, mtime)
                _json_member(tar, "info/paths.json", {"paths": paths, "paths_version": 1}, mtime)
                if exports:
                    _json_member(tar, "info/run_exports.json", exports, mtime)
                for member in _licenses(job, zips):
                    info = tarfile.TarInfo(member.path)
                    info.size, info.mode, info.mtime = member.size, member.mode, mtime
                    with _open(member, zips) as raw:
                        tar.addfile(info, raw)
    finally:
        for zf in zips:
            zf.close()
        shutil.rmtree(staging, ignore_errors=True)
    whole = digests_file(out, ("sha256", "md5")) | {"size": out.stat().st_size}
    # The channel's repodata carries run_exports beside the index, as rattler's indexer writes them.
    return out, index | ({"run_exports": exports} if exports else {}) | whole
