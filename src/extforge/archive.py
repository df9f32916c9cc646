"""The one rule for paths that come from a package: nothing a package says may lead a write
outside the folder it is extracted, published or installed into.

A package names paths in its archive members (and their link targets), in info/paths.json,
info/files, info/has_prefix, the entry points of info/link.json, and its platform subdir in
info/index.json. All of them are checked here, for both formats (`.tar.bz2`: one tarball;
`.conda`: a zip holding `info-*.tar.zst` and `pkg-*.tar.zst`), before anything is written.
Publish, install, the audit and the mirror use this module; a refusal names the member.

The same pass holds every package to an extraction budget, so a decompression bomb is refused
from its tar headers before anything is written: member names no longer than the kernel can
create, metadata members small enough to read into memory, and a total size bounded by what the
package declares of itself (info/paths.json's size_in_bytes, plus slack for info/) and by a
compression-ratio cap (a real package expands 0.5-13x; zeros compress 30,000x).
"""

from __future__ import annotations

import bisect
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

# The extraction budget (see the module's doc).
MAX_NAME_BYTES = 1024  # a whole member name; the longest in a torch env is ~110
MAX_COMPONENT_BYTES = 255  # NAME_MAX of Linux filesystems
MAX_METADATA_BYTES = 64 * 2**20  # one info/ file read into memory (torch's paths.json is ~3 MB)
MAX_RATIO = 200  # expanded bytes per byte of archive
MIN_BUDGET = 64 * 2**20  # a tiny package may expand to this whatever its ratio
DECLARED_SLACK = 64 * 2**20  # info/ (recipe, licenses, tests) is not in paths.json
_TAR_HEADER = 512


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


def name_reason(name: str) -> str | None:
    """Why a member or link name is too long to be created on Linux, or None."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_NAME_BYTES:
        return f"name of {len(raw)} bytes, longer than the {MAX_NAME_BYTES} allowed"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > MAX_COMPONENT_BYTES:
        return f"path component of {len(longest)} bytes, longer than the {MAX_COMPONENT_BYTES} a filesystem allows"
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def budget_refusal(archive: str, member: str, reason: str) -> ExtforgeError:
    return ExtforgeError(
        f"package {archive} refused: member {member!r} {reason}",
        "a package that expands far beyond what it declares of itself is a decompression bomb or damaged; "
        "nothing was extracted past this member",
        "use the file its build tool wrote; do not use archives edited by hand",
        exit_code=1,
    )


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
        try:
            archive_bytes = path.stat().st_size
        except OSError:
            archive_bytes = 0
        self.ratio_budget = max(MIN_BUDGET, archive_bytes * MAX_RATIO)
        self.declared: int | None = None  # paths.json's total, once read
        self.expanded = 0
        # (expanded bytes after it, member): finish() names the member that crossed the declared total.
        self._running: list[tuple[int, str]] = []

    def refuse(self, member: str, reason: str) -> ExtforgeError:
        return member_refusal(self.path.name, member, reason)

    def outer(self, name: str) -> None:
        """A member of a .conda's outer zip."""
        reason = name_reason(name) or unsafe_reason(name)
        if reason:
            raise self.refuse(name, reason)

    def feed(self, tar: tarfile.TarFile, member: tarfile.TarInfo, inner: str = "") -> None:
        """Check one member from its header, before its data is read or written anywhere."""
        shown = f"{inner}:{member.name}" if inner else member.name
        reason = name_reason(member.name) or name_reason(member.linkname) or self.rule.reason(member.name, _kind(member), member.linkname)
        if reason:
            raise self.refuse(shown[:200] + "…" if len(shown) > 200 else shown, reason)
        self.meta.members += 1
        self.expanded += _TAR_HEADER + max(member.size, 0)
        self._running.append((self.expanded, shown))
        limit, why = self._budget()
        if self.expanded > limit:
            raise budget_refusal(self.path.name, shown, f"expands the package to {_size(self.expanded)}, over {why}")
        name = posixpath.normpath(member.name)
        if name in _METADATA and member.isfile():
            if member.size > MAX_METADATA_BYTES:
                raise budget_refusal(self.path.name, shown, f"is {_size(member.size)}, over the {_size(MAX_METADATA_BYTES)} "
                                     "a metadata file may have")
            fh = tar.extractfile(member)
            self._metadata[name] = fh.read() if fh else b""
            if name == "info/paths.json":
                self.declared = self._declared_total()

    def has_read(self, member: tarfile.TarInfo) -> bool:
        """Whether feed() read this member's data (a metadata file): a stream cannot give it again."""
        return posixpath.normpath(member.name) in self._metadata

    def _budget(self) -> tuple[int, str]:
        ratio = (self.ratio_budget, f"{MAX_RATIO}x the archive's size (at least {_size(MIN_BUDGET)})")
        if self.declared is None:
            return ratio
        declared = (self.declared + DECLARED_SLACK, f"the {_size(self.declared)} its info/paths.json declares "
                    f"(+{_size(DECLARED_SLACK)} for info/)")
        return min(ratio, declared)

    def _declared_total(self) -> int | None:
        try:
            entries = json.loads(self._metadata["info/paths.json"]).get("paths", [])
            return sum(e["size_in_bytes"] for e in entries if isinstance(e, dict) and isinstance(e.get("size_in_bytes"), int))
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
            return None  # finish() refuses it, naming the member

    def _check_declared(self) -> None:
        """A .conda streamed pkg- before info- (their order in the zip) learns the declared total last."""
        limit, why = self._budget()
        if self.expanded > limit:
            crossing = bisect.bisect_right([n for n, _ in self._running], limit)
            member = self._running[min(crossing, len(self._running) - 1)][1]
            raise budget_refusal(self.path.name, member, f"expands the package to {_size(self.expanded)} in all, over {why}")

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
        self._check_declared()
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


def package_tars(archive: Path, part: Literal["info", "pkg"]) -> Iterator[tarfile.TarFile]:
    """Stream-mode tarballs of a package: part "info" or "pkg" of a .conda, the one of a .tar.bz2."""
    if archive.name.endswith(".tar.bz2"):
        with archive.open("rb") as fh, tarfile.open(fileobj=fh, mode="r|bz2") as tar:
            yield tar
        return
    with zipfile.ZipFile(archive) as zf:
        for inner in zf.namelist():
            if inner.startswith(f"{part}-") and inner.endswith(".tar.zst"):
                with zf.open(inner) as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr, \
                        tarfile.open(fileobj=zr, mode="r|") as tar:
                    yield tar


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
                # info- first, whatever the zip's order: its paths.json sets the budget of pkg-.
                for inner in sorted(zf.infolist(), key=lambda i: not i.filename.startswith("info-")):
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
