"""Packages and files crafted by hand, the way an attacker or a careless builder would make them.

No build tool writes these: every byte is chosen here, so each case plants exactly one defect.

    craft_package(dest, "evil", [member("../../x")], subdir="linux-64", fmt="conda")

writes `evil-1.0-0.conda` (or `.tar.bz2` with fmt="tar.bz2") whose `info/index.json`,
`info/paths.json` and payload members are all under the caller's control:
- members: Member entries (files, dirs, symlinks, hard links, devices, fifos), written as-is
  into the payload tarball (`pkg-*.tar.zst` for .conda, the one tarball for .tar.bz2);
- paths.json lists the payload's files and links unless `paths=` gives the entries verbatim;
- index.json is `index_json(...)` with `index=` merged over it (`subdir`, `noarch`, ...);
- info_files adds or replaces `info/*` members (e.g. a broken paths.json as raw bytes).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

PAYLOAD = b"written outside the prefix\n"

_TAR_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chardev": tarfile.CHRTYPE,
    "blockdev": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}


@dataclass(frozen=True)
class Member:
    """One tar member. target is the link name for symlinks and hard links."""

    name: str
    data: bytes = PAYLOAD
    kind: str = "file"
    target: str = ""
    mode: int = 0o644

    def tarinfo(self) -> tarfile.TarInfo:
        info = tarfile.TarInfo(self.name)
        info.type = _TAR_TYPES[self.kind]
        info.mode = 0o755 if self.kind == "dir" else self.mode
        info.linkname = self.target
        info.mtime = 1700000000
        if self.kind in ("chardev", "blockdev"):
            info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
        info.size = len(self.data) if self.kind == "file" else 0
        return info


def member(name: str, data: bytes = PAYLOAD, mode: int = 0o644) -> Member:
    return Member(name, data, "file", mode=mode)


def symlink(name: str, target: str) -> Member:
    return Member(name, b"", "symlink", target)


def hardlink(name: str, target: str) -> Member:
    return Member(name, b"", "hardlink", target)


def device(name: str, kind: str = "chardev") -> Member:
    return Member(name, b"", kind)


def tar_bytes(members: list[Member], compression: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}" if compression else "w", format=tarfile.GNU_FORMAT) as tar:
        for m in members:
            tar.addfile(m.tarinfo(), io.BytesIO(m.data) if m.kind == "file" else None)
    return buf.getvalue()


def index_json(name: str, version: str = "1.0", build: str = "0", subdir: str = "noarch", **extra: Any) -> dict[str, Any]:
    index: dict[str, Any] = {
        "name": name, "version": version, "build": build, "build_number": 0, "depends": [],
        "subdir": subdir, "timestamp": 1700000000000,
    }
    if subdir == "noarch":
        index["noarch"] = "generic"
    index.update(extra)
    return index


def paths_entries(members: list[Member]) -> list[dict[str, Any]]:
    """What rattler-build would write in paths.json for these members (files and links only)."""
    entries = []
    for m in members:
        if m.kind == "file":
            entries.append({"_path": m.name, "path_type": "hardlink",
                            "sha256": hashlib.sha256(m.data).hexdigest(), "size_in_bytes": len(m.data)})
        elif m.kind in ("symlink", "hardlink"):
            entries.append({"_path": m.name, "path_type": "softlink" if m.kind == "symlink" else "hardlink",
                            "sha256": hashlib.sha256(b"").hexdigest(), "size_in_bytes": 0})
    return entries


def _info_members(index: dict[str, Any], paths: list[dict[str, Any]], info_files: dict[str, bytes]) -> list[Member]:
    files = {
        "info/index.json": json.dumps(index).encode(),
        "info/paths.json": json.dumps({"paths_version": 1, "paths": paths}).encode(),
        **info_files,
    }
    return [member(name, data) for name, data in files.items()]


def craft_package(
    dest_dir: Path,
    name: str,
    members: list[Member] = (),  # type: ignore[assignment]
    *,
    fmt: str = "conda",
    version: str = "1.0",
    build: str = "0",
    subdir: str = "noarch",
    index: dict[str, Any] | None = None,
    paths: list[dict[str, Any]] | None = None,
    info_files: dict[str, bytes] | None = None,
    filename: str | None = None,
) -> Path:
    """Write one crafted package into dest_dir and return its path (see the module docstring)."""
    members = list(members) or [member(f"share/{name}/data.txt", b"harmless\n")]
    idx = {**index_json(name, version, build, subdir), **(index or {})}
    info = _info_members(idx, paths_entries(members) if paths is None else paths, info_files or {})
    stem = f"{name}-{version}-{build}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "tar.bz2":
        path = dest_dir / (filename or f"{stem}.tar.bz2")
        path.write_bytes(tar_bytes(info + members, "bz2"))
    elif fmt == "conda":
        path = dest_dir / (filename or f"{stem}.conda")
        zstd = zstandard.ZstdCompressor()
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
            zf.writestr(f"info-{stem}.tar.zst", zstd.compress(tar_bytes(info)))
            zf.writestr(f"pkg-{stem}.tar.zst", zstd.compress(tar_bytes(members)))
    else:
        raise ValueError(f"unknown package format {fmt!r}")
    return path


def craft_conda_outer(dest_dir: Path, filename: str, entries: dict[str, bytes]) -> Path:
    """A .conda whose outer zip entries are given verbatim (e.g. a `../x` zip member)."""
    path = dest_dir / filename
    dest_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for entry, data in entries.items():
            zf.writestr(entry, data)
    return path


def craft_wheel(dest_dir: Path, filename: str, files: dict[str, bytes] | None = None) -> Path:
    """A wheel with the given file name (tags are not checked here: that is the point)."""
    path = dest_dir / filename
    dest_dir.mkdir(parents=True, exist_ok=True)
    dist = filename.split("-")[0]
    files = {f"{dist}/__init__.py": b"", f"{dist}-0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
             **(files or {})}
    with zipfile.ZipFile(path, "w") as zf:
        for entry, data in files.items():
            zf.writestr(entry, data)
    return path


def gxx_so(dest_dir: Path, name: str, source: str = "extern \"C\" int f(int x) { return x + 1; }\n", *flags: str) -> Path:
    """A real shared object compiled by g++ (flags are appended, e.g. "-Wl,-rpath,/home/x/lib")."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    src = dest_dir / f"{name}.cpp"
    src.write_text(source)
    out = dest_dir / name
    proc = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(out), str(src), *flags],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"g++ failed for {name}:\n{proc.stderr}")
    src.unlink()
    return out


class _Filler(io.RawIOBase):
    """`size` bytes of zeros (or of os.urandom, which does not compress) read in chunks: a member
    of gigabytes streamed into a tarball without holding it in memory."""

    def __init__(self, size: int, random: bool = False) -> None:
        self.left, self.random = size, random

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self.left)
        buf[:n] = os.urandom(n) if self.random else bytes(n)
        self.left -= n
        return n


def _stream_tar(out: Any, members: list[Member], big: str, size: int, random: bool) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for m in members:
            tar.addfile(m.tarinfo(), io.BytesIO(m.data) if m.kind == "file" else None)
        info = tarfile.TarInfo(big)
        info.size, info.mtime = size, 1700000000
        tar.addfile(info, io.BufferedReader(_Filler(size, random)))


def craft_bomb(dest_dir: Path, name: str, big: str, size: int, *, fmt: str = "conda", random: bool = False,
               pkg_first: bool = True) -> Path:
    """A package whose member `big` (a payload path, or "info/paths.json") expands to `size` bytes
    of zeros (or random bytes) while paths.json declares only the small harmless file.
    pkg_first: the zip's order as rattler-build writes it (pkg- before info-)."""
    small = [member(f"share/{name}/data.txt", b"harmless\n")]
    info = _info_members(index_json(name), paths_entries(small), {})
    info = [m for m in info if m.name != big]
    in_info = big.startswith("info/")
    stem = f"{name}-1.0-0"
    dest_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "tar.bz2":
        import bz2

        path = dest_dir / f"{stem}.tar.bz2"
        with bz2.open(path, "wb", compresslevel=1) as out:
            _stream_tar(out, info + small, big, size, random)
        return path
    path = dest_dir / f"{stem}.conda"
    zstd = zstandard.ZstdCompressor(level=1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        parts = [(f"pkg-{stem}.tar.zst", small, not in_info), (f"info-{stem}.tar.zst", info, in_info)]
        for inner, members, has_big in parts if pkg_first else parts[::-1]:
            with zf.open(inner, "w", force_zip64=True) as raw, zstd.stream_writer(raw, closefd=False) as out:
                if has_big:
                    _stream_tar(out, members, big, size, random)
                else:
                    out.write(tar_bytes(members))
    return path
