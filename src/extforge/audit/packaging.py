"""Open an audit target (a .conda/.tar.bz2 package, a wheel, a prefix, a single .so)
and find the ELF files to audit in it.

Packages are streamed: only shared objects, symlinks between them and the metadata
are extracted to a temporary folder; Python sources are counted, not written.
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

import zstandard

from ..archive import PackageCheck, member_refusal, unsafe_reason
from ..errors import ExtforgeError
from ..paths import scratch_dir
from .elf import is_elf
from .report import Finding

EXT_MODULE = re.compile(r"\.(cpython-\d+[^.]*|abi3|pypy[^.]*)\.so$")
_SHARED = re.compile(r"\.so(\.\d+)*$")
METADATA_LIMIT = 16 * 1024 * 1024


@dataclass
class Payload:
    kind: str  # "conda", "wheel", "prefix", "directory", "so"
    source: Path
    root: Path  # where the files lie (a temporary folder for archives)
    elf_files: list[Path] = field(default_factory=list)
    python_files: int = 0
    name: str | None = None
    version: str | None = None
    build: str | None = None
    depends: list[str] = field(default_factory=list)
    wheel_tags: list[str] = field(default_factory=list)
    requires_dist: list[str] = field(default_factory=list)  # a wheel's Requires-Dist lines
    subdir: str | None = None  # the platform a conda package installs on (info/index.json)
    # file -> the build prefix written into it, which conda clients replace with the install prefix
    placeholders: dict[str, str] = field(default_factory=dict)

    @property
    def extension_modules(self) -> list[Path]:
        return [p for p in self.elf_files if is_extension_module(p)]

    def relative(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return path.name


def is_extension_module(path: Path) -> bool:
    return bool(EXT_MODULE.search(path.name))


def pinned_glibc(depends: list[str]) -> str | None:
    """'__glibc >=2.28,<3.0.a0' in a package's depends -> '2.28'."""
    for dep in depends:
        if m := re.match(r"__glibc\s*>=\s*([\d.]+)", dep):
            return m.group(1)
    return None


@contextmanager
def open_target(path: Path) -> Iterator[Payload]:
    if not path.exists():
        raise ExtforgeError(f"{path} does not exist", "", "pass a .conda/.tar.bz2 package, a wheel, a prefix or a .so")
    if path.is_dir():
        yield _scan_directory(path)
        return
    if not path.is_file():  # opening a FIFO would wait for a writer for ever; a device never ends
        raise ExtforgeError(f"cannot audit {path}: it is not a regular file", "it is a FIFO, socket or device",
                            "pass a package, wheel, prefix or .so file")
    name = path.name
    if name.endswith((".conda", ".tar.bz2", ".whl")):
        with scratch_dir("audit") as root:
            if name.endswith(".conda"):
                payload = _extract_conda(path, root)
            elif name.endswith(".tar.bz2"):
                payload = _extract_tar_bz2(path, root)
            else:
                payload = _extract_wheel(path, root)
            payload.elf_files = sorted(p for p in payload.elf_files if p.is_file() and not p.is_symlink() and is_elf(p))
            yield payload
        return
    if is_elf(path):
        yield Payload("so", path, path.parent, elf_files=[path])
        return
    raise ExtforgeError(
        f"cannot audit {path}",
        "it is not a .conda/.tar.bz2 package, a wheel, a directory or an ELF shared object",
        "pass one of those",
    )


def _scan_directory(root: Path) -> Payload:
    sites = sorted(root.glob("lib/python3*/site-packages"))
    if sites or (root / "conda-meta").is_dir():
        # An installed prefix: its extension modules; libraries are checked as their dependencies.
        payload = Payload("prefix", root, root)
        for site in sites:
            for p in site.rglob("*.so"):
                if is_extension_module(p) and p.is_file() and not p.is_symlink() and is_elf(p):
                    payload.elf_files.append(p)
            payload.python_files += sum(1 for _ in site.rglob("*.py"))
    else:
        payload = Payload("directory", root, root)
        for p in root.rglob("*"):
            if _SHARED.search(p.name) and p.is_file() and not p.is_symlink() and is_elf(p):
                payload.elf_files.append(p)
            elif p.suffix == ".py":
                payload.python_files += 1
    payload.elf_files.sort()
    return payload


def _extract_members(tar: tarfile.TarFile, root: Path, payload: Payload, check: PackageCheck) -> None:
    """Extract shared objects from a streamed tar, after the package path rule passed each member."""
    for member in tar:
        check.feed(tar, member)
        name = member.name.lstrip("./")
        if name.endswith(".py"):
            payload.python_files += 1
        if _SHARED.search(name) and (member.isfile() or member.issym()):
            # Checked above; the data filter is a second line where this Python has it (>= 3.11.4).
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, root, filter="data")
            else:
                tar.extract(member, root)
            if member.isfile():
                payload.elf_files.append(root / name)


def _read_index(payload: Payload, check: PackageCheck) -> None:
    meta = check.finish()
    payload.name, payload.version, payload.build = meta.name, meta.version, meta.build
    depends = meta.index.get("depends", [])
    payload.depends = [str(d) for d in depends] if isinstance(depends, list) else []
    payload.subdir = meta.subdir
    payload.placeholders = {e["_path"]: e["prefix_placeholder"] for e in check.paths_entries()
                            if isinstance(e.get("prefix_placeholder"), str) and e.get("file_mode") == "binary"}


def _zstd_tar(fileobj: IO[bytes]) -> tarfile.TarFile:
    return tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(fileobj), mode="r|")


def _extract_conda(path: Path, root: Path) -> Payload:
    payload = Payload("conda", path, root)
    check = PackageCheck(path)
    try:
        with zipfile.ZipFile(path) as zf:
            for member in zf.namelist():
                check.outer(member)
                if member.endswith(".tar.zst") and member.startswith(("pkg-", "info-")):
                    with zf.open(member) as raw, _zstd_tar(raw) as tar:
                        _extract_members(tar, root, payload, check)
    except (zipfile.BadZipFile, tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise ExtforgeError(f"{path} is not a readable .conda package", str(exc), "rebuild or re-download it") from exc
    _read_index(payload, check)
    return payload


def _extract_tar_bz2(path: Path, root: Path) -> Payload:
    payload = Payload("conda", path, root)
    check = PackageCheck(path)
    try:
        with tarfile.open(path, mode="r|bz2") as tar:
            _extract_members(tar, root, payload, check)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ExtforgeError(f"{path} is not a readable .tar.bz2 package", str(exc), "rebuild or re-download it") from exc
    _read_index(payload, check)
    return payload


def _extract_wheel(path: Path, root: Path) -> Payload:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    payload = Payload("wheel", path, root)
    try:
        parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise ExtforgeError(f"{path.name} is not a valid wheel file name", str(exc),
                            "a wheel is named NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl") from exc
    parts = path.name[: -len(".whl")].split("-")
    payload.name, payload.version = parts[0], parts[1]
    payload.wheel_tags = [f"{parts[-3]}-{parts[-2]}-{parts[-1]}"]
    try:
        with zipfile.ZipFile(path) as zf:
            for member in zf.namelist():
                if reason := unsafe_reason(member):
                    raise member_refusal(path.name, member, reason, "wheel")
                if member.endswith(".py"):
                    payload.python_files += 1
                elif _SHARED.search(member):
                    zf.extract(member, root)
                    payload.elf_files.append(root / member)
                elif member.count("/") == 1 and member.endswith(".dist-info/METADATA"):
                    with zf.open(member) as fh:
                        text = fh.read(METADATA_LIMIT).decode("utf-8", "replace")
                    payload.requires_dist = [line.split(":", 1)[1].strip() for line in text.splitlines()
                                             if line.startswith("Requires-Dist:")]
                elif PurePosixPath(member).name == "WHEEL" and member.count("/") == 1:
                    tags = [line.split(":", 1)[1].strip() for line in zf.read(member).decode().splitlines()
                            if line.startswith("Tag:")]
                    payload.wheel_tags = tags or payload.wheel_tags
        bad = [t for t in payload.wheel_tags if len(t.split("-")) != 3 or not all(t.split("-"))]
        if bad:
            raise ExtforgeError(f"{path.name} has a malformed wheel tag {bad[0]!r}",
                                "a wheel tag is python-abi-platform (e.g. cp312-cp312-linux_x86_64)",
                                "rebuild the wheel with a standard build backend")
    except zipfile.BadZipFile as exc:
        raise ExtforgeError(f"{path} is not a readable wheel", str(exc), "rebuild or re-download it") from exc
    return payload


def beside_python_code(payload: Payload) -> list[Path]:
    """Shared objects inside an installed Python package (`*-packages/<pkg>/...so`): extension
    modules, or torch op libraries a package loads with torch.ops.load_library (torch-scatter's
    `_scatter_cuda.so` has no Python ABI tag in its name and is no importable module). A wheel's
    root is site-packages itself: there, any shared object in a package folder."""
    def beside(parts: tuple[str, ...]) -> bool:
        if payload.kind == "wheel":
            return len(parts) >= 2 and not parts[0].endswith((".data", ".dist-info"))
        return any(part.endswith("-packages") for part in parts[:-2])

    return [p for p in payload.elf_files if beside(Path(payload.relative(p)).parts)]


def packaging_findings(payload: Payload) -> list[Finding]:
    """A CUDA extension package must carry compiled code where its Python expects it."""
    findings: list[Finding] = []
    for tag in payload.wheel_tags:
        _py, abi, plat = tag.split("-")
        if abi == "none" or plat == "any":
            findings.append(Finding(
                "error", "packaging", f"wheel is tagged {tag}, which cannot carry compiled kernels",
                cause="the build produced a pure-Python wheel (the extension was not compiled or not included)",
                fix="build the extension (e.g. FLASH_ATTENTION_FORCE_BUILD=TRUE) so the wheel gets a "
                    "cpXY-cpXY-linux_x86_64 tag and its .so",
            ))
    if not payload.elf_files:
        findings.append(Finding(
            "error", "packaging", f"{payload.source.name} contains no ELF shared object to audit",
            cause="ships Python code but no extension module" if payload.python_files else "the package is empty",
            fix="check that the build compiled the extension and installed it into the package",
        ))
    elif payload.python_files and not payload.extension_modules and not beside_python_code(payload) \
            and payload.kind in ("conda", "wheel"):
        findings.append(Finding(
            "error", "packaging",
            f"{payload.source.name} ships {payload.python_files} Python file(s) but no compiled module beside them",
            cause="the extension module was not built or was installed outside the package",
            fix="check the build script installs the compiled *.cpython-*.so (or the torch op library that "
                "torch.ops.load_library loads) next to its Python code",
        ))
    return findings
