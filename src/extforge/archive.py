"""The one rule for paths that come from a package: nothing a package says may lead a write
outside the folder it is extracted, published or installed into.

A package names paths in its archive members (and their link targets), in info/paths.json,
info/files, info/has_prefix, the entry points of info/link.json, and its platform subdir in
info/index.json. All of them are checked here, for both formats (`.tar.bz2`: one tarball;
`.conda`: a zip holding `info-*.tar.zst` and `pkg-*.tar.zst`), before anything is written.
Publish, install, the audit and the mirror use this module; a refusal names the member.
"""

from __future__ import annotations

import functools
import json
import posixpath
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import zstandard

from .errors import ExtforgeError

# Metadata members whose contents name paths or the subdir; each is a few kB.
_METADATA = ("info/index.json", "info/paths.json", "info/link.json", "info/files", "info/has_prefix")
# More symlink hops than this is a loop (Linux gives up after 40 as well).
_MAX_HOPS = 40


@functools.cache
def known_subdirs() -> frozenset[str]:
    """The platform names conda and rattler know (linux-64, noarch, ...)."""
    from rattler import Subdir

    return frozenset(str(p) for p in Subdir.all())


def subdir_reason(subdir: object) -> str | None:
    """Why a package's `subdir` cannot be used as a channel folder name, or None."""
    if isinstance(subdir, str) and subdir in known_subdirs():
        return None
    return f"subdir {subdir!r} is not a known platform name"


def unsafe_reason(name: str, kind: str = "file", linkname: str = "") -> str | None:
    """Why a path would escape its root on its own (without other members' symlinks), or None.

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


def member_refusal(archive: str, member: str, reason: str, kind: str = "package") -> ExtforgeError:
    return ExtforgeError(
        f"{kind} {archive} refused: member {member!r} is unsafe ({reason})",
        "using it would write outside the channel, the environment prefix or the folder it is extracted into",
        "use the file its build tool wrote; do not use archives edited by hand",
        exit_code=1,
    )


class PathRule:
    """unsafe_reason plus the symlinks seen so far: `lib -> .` then `lib/../../x` is caught,
    because the filesystem resolves `lib` before `..`, where plain normalisation would not."""

    def __init__(self) -> None:
        self._links: dict[str, str] = {}

    def _resolve(self, path: str, hops: int = 0) -> str | None:
        """path (relative to the root) with every known symlink followed; None if it leaves."""
        parts: list[str] = []
        for comp in path.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not parts:
                    return None
                parts.pop()
                continue
            parts.append(comp)
            target = self._links.get("/".join(parts))
            if target is not None:
                if target.startswith("/") or hops >= _MAX_HOPS:
                    return None
                resolved = self._resolve(posixpath.join(*parts[:-1], target) if len(parts) > 1 else target, hops + 1)
                if resolved is None:
                    return None
                parts = resolved.split("/") if resolved else []
        return "/".join(parts)

    def reason(self, name: str, kind: str = "file", linkname: str = "") -> str | None:
        plain = unsafe_reason(name, kind, linkname)
        if plain:
            return plain
        # Not normalised first: `lib/up/../x` must go through the symlink `lib/up`, as open() would.
        head, _, tail = name.rstrip("/").rpartition("/")
        parent = self._resolve(head)
        if parent is None:
            return "path goes through a symlink that leads outside the prefix"
        if tail in ("", ".", ".."):
            if kind not in ("dir", "file") or self._resolve(name) is None:
                return "path leaves the prefix (..)"
            return None
        here = posixpath.join(parent, tail) if parent else tail
        if kind == "symlink":
            if self._resolve(posixpath.join(parent, linkname) if parent else linkname) is None:
                return f"symlink {linkname} points outside the prefix (through another symlink)"
            self._links[here] = linkname
        elif kind == "hardlink" and self._resolve(linkname) is None:
            return f"hard link to {linkname} outside the prefix (through a symlink)"
        elif kind != "dir" and self._resolve(here) is None:
            return "path goes through a symlink that leads outside the prefix"
        return None


@dataclass
class PackageMeta:
    """What a checked package says about itself."""

    file: str
    name: str = ""
    version: str = ""
    build: str = ""
    subdir: str = ""
    members: int = 0
    index: dict = field(default_factory=dict)


class PackageCheck:
    """The rule applied to one package while its members stream past (no extraction needed).

    feed() every member of every inner tarball in archive order, then finish(): it raises
    ExtforgeError naming the first unsafe member or metadata entry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rule = PathRule()
        self.meta = PackageMeta(path.name)
        self._metadata: dict[str, bytes] = {}

    def refuse(self, member: str, reason: str) -> ExtforgeError:
        return member_refusal(self.path.name, member, reason)

    def outer(self, name: str) -> None:
        """A member of a .conda's outer zip."""
        reason = unsafe_reason(name)
        if reason:
            raise self.refuse(name, reason)

    def feed(self, tar: tarfile.TarFile, member: tarfile.TarInfo, inner: str = "") -> None:
        reason = self.rule.reason(member.name, _kind(member), member.linkname)
        if reason:
            raise self.refuse(f"{inner}:{member.name}" if inner else member.name, reason)
        self.meta.members += 1
        name = posixpath.normpath(member.name)
        if name in _METADATA and member.isfile():
            fh = tar.extractfile(member)
            self._metadata[name] = fh.read() if fh else b""

    def _json(self, name: str) -> dict:
        try:
            data = json.loads(self._metadata[name])
        except (ValueError, UnicodeDecodeError) as exc:
            raise self.refuse(name, f"not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise self.refuse(name, "not a JSON object")
        return data

    def finish(self) -> PackageMeta:
        if "info/index.json" not in self._metadata:
            raise self.refuse("info/index.json", "missing: the package does not say what it is")
        index = self._json("info/index.json")
        reason = subdir_reason(index.get("subdir", "noarch"))
        if reason:
            raise self.refuse("info/index.json", reason)
        self.meta.index = index
        self.meta.name, self.meta.version, self.meta.build = (str(index.get(k, "")) for k in ("name", "version", "build"))
        self.meta.subdir = index.get("subdir", "noarch")
        for listed in self._listed_paths():
            reason = self.rule.reason(listed)
            if reason:
                raise self.refuse(listed, f"{reason}; named in the package's metadata")
        return self.meta

    def paths_entries(self) -> list[dict]:
        """info/paths.json's entries, each a dict with a '_path' string (finish() checked them)."""
        return self._json("info/paths.json").get("paths", []) if "info/paths.json" in self._metadata else []

    def _listed_paths(self) -> Iterator[str]:
        if "info/paths.json" in self._metadata:
            entries = self._json("info/paths.json").get("paths", [])
            if not isinstance(entries, list):
                raise self.refuse("info/paths.json", "'paths' is not a list")
            for entry in entries:
                path = entry.get("_path") if isinstance(entry, dict) else None
                if not isinstance(path, str):
                    raise self.refuse("info/paths.json", f"entry without a '_path' string: {entry!r}")
                yield path
        for line in self._metadata.get("info/files", b"").decode("utf-8", "replace").splitlines():
            if line.strip():
                yield line.strip()
        for line in self._metadata.get("info/has_prefix", b"").decode("utf-8", "replace").splitlines():
            if line.strip():
                yield line.split()[-1].strip("\"'")
        if "info/link.json" in self._metadata:
            noarch = self._json("info/link.json").get("noarch") or {}
            for entry in noarch.get("entry_points", []) if isinstance(noarch, dict) else []:
                script = str(entry).split("=", 1)[0].strip()
                if not script or "/" in script or script in (".", ".."):
                    raise self.refuse("info/link.json", f"entry point name {script!r} is not a plain file name")
                yield f"bin/{script}"


def _tar_members(fileobj: IO[bytes], mode: Literal["r|bz2", "r|"]) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    # Stream mode: a 1 GB package is scanned without seeking or buffering it whole.
    with tarfile.open(fileobj=fileobj, mode=mode) as tar:
        for member in tar:
            yield tar, member


def check_package(path: Path) -> PackageMeta:
    """Check every path a package names; raise ExtforgeError naming the first unsafe one."""
    check = PackageCheck(path)
    try:
        if path.name.endswith(".tar.bz2"):
            with path.open("rb") as fh:
                for tar, member in _tar_members(fh, "r|bz2"):
                    check.feed(tar, member)
        elif path.name.endswith(".conda"):
            with zipfile.ZipFile(path) as zf:
                for inner in zf.infolist():
                    check.outer(inner.filename)
                    if not inner.filename.endswith(".tar.zst"):
                        continue
                    with zf.open(inner) as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr:
                        for tar, member in _tar_members(zr, "r|"):
                            check.feed(tar, member, inner.filename)
        else:
            raise ExtforgeError(
                f"{path.name} is not a conda package",
                "only .conda and .tar.bz2 archives are packages",
                "pass the package files rattler-build wrote",
            )
    except (tarfile.TarError, zipfile.BadZipFile, zstandard.ZstdError, EOFError, OSError) as exc:
        raise ExtforgeError(f"{path} is not a readable conda package", str(exc), "rebuild or re-download it") from exc
    return check.finish()
