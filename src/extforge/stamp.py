"""Audit metadata inside packages: share/extforge/audit/<name>.json (docs/architecture.md).

`extforge build` stamps what it built so `extforge verify` can admit a node from the
installed prefix alone. The file is added to the package payload and listed in
info/paths.json and info/files like any other file, so conda and rattler install,
verify and remove it normally. Stamping also takes the builder's own folders out of
info/about.json. What the record proves a node needs (`run_requirements`: its
glibc, its CUDA driver) also goes into info/index.json's depends, so the channel's repodata
carries it and a solve for nodes that lack it fails at lock time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from .errors import ExtforgeError
from .safe_files import atomic_writer

AUDIT_DIR = "share/extforge/audit"
SCHEMA = 1
ZSTD_LEVEL = 15  # rattler-build's default for .conda members
# At this level zstd cuts a stream into ~16 MB jobs, each worker holding ~100 MB: a full
# flash-attn payload (~220 MB) has no work for more, and 16 workers stay under 2 GB.
MAX_ZSTD_THREADS = 16


@dataclass(frozen=True)
class AuditStamp:
    """The audit record a package carries (share/extforge/audit/<name>.json): written by
    `stamp_package` alone, read back by `read_stamps` alone (node admission, verify)."""

    name: str
    version: str | None = None
    build: str | None = None
    sass_archs: tuple[str, ...] = ()
    ptx_archs: tuple[str, ...] = ()
    cxx11_abi: bool | None = None
    glibc_floor: str | None = None
    glibcxx_floor: str | None = None
    torch: str | None = None
    audited_against: str | None = None
    cuda_version: str | None = None
    verdict: str = ""
    schema: int = SCHEMA

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditStamp:
        """A record as stamped; keys a newer extforge added are ignored, missing ones default."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("name", "")
        for key in ("sass_archs", "ptx_archs"):
            values[key] = tuple(values.get(key) or ())
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sass_archs": list(self.sass_archs), "ptx_archs": list(self.ptx_archs)}


def run_requirements(record: AuditStamp, toolkit: str | None = None) -> list[str]:
    """What the audit proved a node must have, as conda-forge writes it into run requirements: the
    glibc floor as the sysroot packages export it (`__glibc >=2.32,<3.0.a0`), and for GPU code the
    driver of the CUDA toolkit that compiled it (`toolkit`, else the torch's CUDA) as cuda-version
    constrains it: its major (`__cuda >=12`: by CUDA's minor version compatibility a 12.0 driver
    runs 12.8's SASS), or major.minor where the package ships PTX, which a driver JIT-compiles
    only from a PTX version it knows."""
    out = []
    if record.glibc_floor:
        out.append(f"__glibc >={record.glibc_floor},<3.0.a0")
    cuda = re.match(r"(\d+)\.(\d+)", toolkit or record.cuda_version or "")
    if cuda and (record.sass_archs or record.ptx_archs):
        out.append(f"__cuda >={cuda[0] if record.ptx_archs else cuda[1]}")
    return out


def stamp_package(path: Path, record: AuditStamp, *, requires: Sequence[str] = (),
                  threads: int | None = None) -> AuditStamp:
    """Write the record (AuditReport.to_stamp) into the package at `path` (replaced in place, atomically),
    and add `requires` (run_requirements) to its depends where the recipe named no version of that
    package itself (a sysroot's `__glibc` export: the audit checked the modules against it).

    A .conda's payload is recompressed at rattler-build's level on `threads` threads (default:
    the cores this process may use, at most MAX_ZSTD_THREADS): one thread took 42 s for the full
    flash-attn package, ~8% of its whole build on a 32-core node."""
    path = Path(path)
    threads = threads or min(MAX_ZSTD_THREADS, len(os.sched_getaffinity(0)))
    data = (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()
    stamp = _Stamp(f"{AUDIT_DIR}/{record.name}.json", data, requires)
    if not path.name.endswith((".conda", ".tar.bz2")):
        raise ExtforgeError(f"cannot stamp {path}", "only .conda and .tar.bz2 packages carry audit metadata",
                            "stamp the conda package, not a wheel or a prefix")
    try:
        # The stamped copy replaces the package under its own mode, through a fresh temporary.
        with atomic_writer(path, mode=path.stat().st_mode & 0o7777, tmp_prefix="stamp-") as out:
            if path.name.endswith(".conda"):
                _stamp_conda(path, out, stamp, threads)
            else:
                with tarfile.open(path, "r|bz2") as src, tarfile.open(fileobj=out, mode="w|bz2") as dst:
                    _copy_tar(src, dst, stamp, add_payload=True)
    except (tarfile.TarError, zipfile.BadZipFile, zstandard.ZstdError, OSError) as exc:
        raise ExtforgeError(f"cannot stamp {path}", str(exc), "rebuild the package; it may be damaged") from exc
    return record


def read_stamps(prefix: Path) -> list[AuditStamp]:
    """The audit records of every stamped package installed in `prefix`."""
    return [AuditStamp.from_json(json.loads(p.read_text())) for p in sorted((Path(prefix) / AUDIT_DIR).glob("*.json"))]


class _Stamp:
    def __init__(self, relpath: str, data: bytes, requires: Sequence[str] = ()):
        self.relpath = relpath
        self.data = data
        self.requires = requires
        self.entry = {"_path": relpath, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
                      "size_in_bytes": len(data)}

    def patch(self, name: str, content: bytes) -> bytes:
        if name == "info/about.json":
            return _without_build_paths(content)
        if name == "info/index.json":
            index = json.loads(content)
            named = {d.split()[0] for d in index.get("depends", []) if d.strip()}
            added = [r for r in self.requires if r.split()[0] not in named]
            if not added:
                return content
            index["depends"] = [*index.get("depends", []), *added]
            return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
        if name == "info/paths.json":
            meta = json.loads(content)
            paths = [p for p in meta.get("paths", []) if p.get("_path") != self.relpath] + [self.entry]
            meta["paths"] = sorted(paths, key=lambda p: p["_path"])
            return (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
        lines = [line for line in content.decode().splitlines() if line and line != self.relpath]
        return ("\n".join(sorted([*lines, self.relpath])) + "\n").encode()


def _local(channel: object) -> bool:
    return isinstance(channel, str) and channel.startswith(("file:", "/", "~"))


def _without_build_paths(content: bytes) -> bytes:
    """about.json without the channels the build read from the builder's own disk (rattler-build
    lists `file:///home/…/mirror/`): those name nothing a user of the package can reach, tell
    everyone the builder's folders, and make the same build differ from one folder to the next."""
    try:
        about = json.loads(content)
    except ValueError:
        return content
    if not isinstance(about, dict) or not any(map(_local, about.get("channels") or [])):
        return content
    about["channels"] = [c for c in about["channels"] if not _local(c)]
    return (json.dumps(about, indent=2, sort_keys=True) + "\n").encode()


_PATCHED = ("info/index.json", "info/paths.json", "info/files", "info/about.json")


def _copy_tar(src: tarfile.TarFile, dst: tarfile.TarFile, stamp: _Stamp, *, add_payload: bool) -> None:
    for member in src:
        name = member.name.removeprefix("./")
        if name == stamp.relpath:
            continue
        fileobj = src.extractfile(member) if member.isfile() else None
        if name in _PATCHED and fileobj is not None:
            content = stamp.patch(name, fileobj.read())
            member.size = len(content)
            fileobj = io.BytesIO(content)
        dst.addfile(member, fileobj)
    if add_payload:
        info = tarfile.TarInfo(stamp.relpath)
        info.size, info.mode, info.mtime = len(stamp.data), 0o644, int(time.time())
        dst.addfile(info, io.BytesIO(stamp.data))


def _stamp_conda(path: Path, out_file: BinaryIO, stamp: _Stamp, threads: int) -> None:
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out_file, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            is_pkg = item.filename.startswith("pkg-") and item.filename.endswith(".tar.zst")
            is_info = item.filename.startswith("info-") and item.filename.endswith(".tar.zst")
            if not (is_pkg or is_info):
                zout.writestr(item, zin.read(item))
                continue
            with zin.open(item) as raw, zout.open(item.filename, "w", force_zip64=True) as out:
                reader = zstandard.ZstdDecompressor().stream_reader(raw)
                # zstd's threads=0 is its single-threaded mode (1 would add a worker beside this thread).
                writer = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=threads if threads > 1 else 0
                                                  ).stream_writer(out, closefd=False)
                with tarfile.open(fileobj=reader, mode="r|") as src, tarfile.open(fileobj=writer, mode="w|") as dst:
                    _copy_tar(src, dst, stamp, add_payload=is_pkg)
                writer.close()
