"""Archive member checks: a package must not write outside the prefix it is installed into.

Members are checked before anything is extracted, for both package formats: `.tar.bz2`
(one tarball) and `.conda` (a zip holding `info-*.tar.zst` and `pkg-*.tar.zst`).
"""

from __future__ import annotations

import posixpath
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from .errors import ExtforgeError


def unsafe_reason(name: str, kind: str = "file", linkname: str = "") -> str | None:
    """Why an archive member would escape the extraction root, or None when it is safe.

    kind is "file", "dir", "symlink", "hardlink" or "special" (devices, fifos).
    """
    if kind == "special":
        return "device or fifo member"
    if not name or name.startswith("/"):
        return "absolute path"
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        return "path leaves the prefix (..)"
    if kind == "symlink":
        if linkname.startswith("/"):
            return f"symlink to absolute path {linkname}"
        target = posixpath.normpath(posixpath.join(posixpath.dirname(norm), linkname))
        if target == ".." or target.startswith("../"):
            return f"symlink {linkname} points outside the prefix"
    if kind == "hardlink":
        return unsafe_reason(linkname) and f"hard link to {linkname} outside the prefix"
    return None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.isdir():
        return "dir"
    if member.isfile():
        return "file"
    return "special"


def member_unsafe_reason(member: tarfile.TarInfo) -> str | None:
    """unsafe_reason for a tar member."""
    return unsafe_reason(member.name, _kind(member), member.linkname)


def _tar_members(fileobj: IO[bytes], mode: Literal["r|bz2", "r|"]) -> Iterator[tarfile.TarInfo]:
    # Stream mode: a 1 GB package is scanned without seeking or buffering it whole.
    with tarfile.open(fileobj=fileobj, mode=mode) as tar:
        yield from tar


def archive_members(path: Path) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """(inner archive, member) for every member of a conda package."""
    if path.name.endswith(".tar.bz2"):
        with path.open("rb") as fh:
            for member in _tar_members(fh, "r|bz2"):
                yield path.name, member
    elif path.name.endswith(".conda"):
        import zstandard

        with zipfile.ZipFile(path) as zf:
            for inner in zf.infolist():
                if unsafe_reason(inner.filename):
                    raise _refusal(path, inner.filename, unsafe_reason(inner.filename) or "")
                if not inner.filename.endswith(".tar.zst"):
                    continue
                with zf.open(inner) as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr:
                    for member in _tar_members(zr, "r|"):
                        yield inner.filename, member
    else:
        raise ExtforgeError(
            f"{path.name} is not a conda package",
            "only .conda and .tar.bz2 archives are packages",
            "pass the package files rattler-build wrote",
        )


def _refusal(path: Path, member: str, reason: str) -> ExtforgeError:
    return ExtforgeError(
        f"package {path.name} refused: member {member!r} is unsafe ({reason})",
        "extracting it would write outside the environment prefix",
        "rebuild the package from its recipe; do not install archives edited by hand",
        exit_code=1,
    )


def check_archive(path: Path) -> int:
    """Raise ExtforgeError naming the first unsafe member; return the number of members checked."""
    count = 0
    for inner, member in archive_members(path):
        reason = member_unsafe_reason(member)
        if reason:
            where = member.name if inner == path.name else f"{inner}:{member.name}"
            raise _refusal(path, where, reason)
        count += 1
    return count
