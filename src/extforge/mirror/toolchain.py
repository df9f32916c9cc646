"""Compiler activation packages (conda-forge names) that point at the host's gcc; the CUDA
toolkit is packaged for real (cuda_toolkit.py).

Recipes stay written as for conda-forge (`${{ compiler('cxx') }}`, `${{ compiler('cuda') }}`
with `cuda_compiler: cuda-nvcc`); these shims make those names resolve offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..doctor.compiler import parse_print_file_name
from ..errors import ExtforgeError
from ..recipes.build_layer import LAYER_PACKAGE, layer_files
from ..ui import log
from .hashing import stat_identity, text_identity
from .recipes import PackageJob

DISTRO_GXX = "/usr/bin/g++"


@dataclass(frozen=True)
class Toolchain:
    gcc: str
    gxx: str
    gcc_version: str  # 12.2.0

    @property
    def gcc_major(self) -> str:
        return self.gcc_version.split(".")[0]


def parse_nvcc_version(text: str) -> str | None:
    m = re.search(r"release \S+, V(\d+\.\d+\.\d+)", text)
    return m.group(1) if m else None


def shared_libstdcxx(gxx: str) -> str | None:
    """The libstdc++.so that `gxx` links by default; None if it would link libstdc++.a.

    Such a g++ (e.g. a relocated toolchain that ships only libstdc++.a) puts a second C++
    runtime into every extension, exported beside the libstdc++.so.6 torch loads."""
    try:
        out = subprocess.run([gxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return parse_print_file_name(out)


def pick_compilers() -> tuple[str, str]:
    """CC and CXX (else gcc and g++ on PATH), unless that g++ links libstdc++ statically: then
    the first g++ on PATH or in /usr/bin that links the shared one, with the gcc beside it."""
    gcc = shutil.which(os.environ.get("CC") or "gcc") or "gcc"
    gxx = shutil.which(os.environ.get("CXX") or "g++") or "g++"
    if shared_libstdcxx(gxx):
        return gcc, gxx
    for candidate in dict.fromkeys(filter(None, (shutil.which("g++"), DISTRO_GXX))):
        if candidate != gxx and shared_libstdcxx(candidate):
            log.warning("%s links libstdc++ statically (no libstdc++.so beside it): extensions would carry "
                        "a second C++ runtime next to torch's libstdc++.so.6; the mirror's compilers use %s instead",
                        gxx, candidate)
            sibling = Path(candidate).with_name("gcc")
            return (str(sibling) if sibling.exists() else gcc), candidate
    raise ExtforgeError(
        f"{gxx} links libstdc++ statically and no other g++ here links the shared libstdc++",
        "an extension built with it carries its own copy of the C++ runtime and exports it beside the "
        "libstdc++.so.6 that torch loads (two runtimes in one process)",
        "install the distribution's g++ (its libstdc++-dev provides libstdc++.so), or point CXX at a "
        "g++ whose `g++ -print-file-name=libstdc++.so` prints a path",
    )


def detect() -> Toolchain:
    gcc, gxx = pick_compilers()
    try:
        gcc_version = subprocess.run([gcc, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gcc_version = ""
    return Toolchain(gcc, gxx, gcc_version or "0.0.0")


def activation(name: str, body: str) -> list[str]:
    return [f"etc/conda/activate.d/extforge-{name}.sh", body, "644"]


def shim(name: str, version: str, body: str, depends: list[str] | None = None) -> PackageJob:
    texts = [activation(name, body)]
    return PackageJob(
        name=name,
        version=version,
        build_string="h${{ hash }}_0",
        depends=depends or [],
        manifest={"texts": texts},
        identity=text_identity(body),
        summary=f"{name} activation shim for the host toolchain (extforge mirror)",
        license="BSD-3-Clause",
    )


def compiler_jobs(tc: Toolchain) -> list[PackageJob]:
    jobs = [
        shim("gcc_linux-64", tc.gcc_version, f'export CC="{tc.gcc}"\nexport CC_FOR_BUILD="{tc.gcc}"\n'),
        shim(
            "gxx_linux-64",
            tc.gcc_version,
            f'export CXX="{tc.gxx}"\nexport CXX_FOR_BUILD="{tc.gxx}"\n',
            [f"gcc_linux-64 =={tc.gcc_version}"],
        ),
    ]
    patchelf = patchelf_job()
    return jobs + ([patchelf] if patchelf else []) + [layer_job()]


def layer_job() -> PackageJob:
    """The build layer every torch extension recipe lists (extforge.recipes.build_layer): extforge's own
    files, so every channel `extforge mirror` writes can build any such recipe."""
    texts = [list(f) for f in layer_files()]
    return PackageJob(
        name=LAYER_PACKAGE,
        version=__version__,
        build_string="h${{ hash }}_0",
        manifest={"texts": texts},
        identity=text_identity(*(f"{path}:{mode}:{body}" for path, body, mode in texts)),
        summary="extforge's build layer for torch extensions: no network, the variant's GPU archs, torch's C++ ABI "
                "and standard, planned jobs, compile cache, build record",
        license="BSD-3-Clause",
    )


def patchelf_job() -> PackageJob | None:
    """`patchelf`, which conda-forge recipes list in build, from the binary rattler-build relinks with."""
    exe = shutil.which("patchelf")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()
    files = [[str(Path(exe).resolve()), "bin/patchelf", ""]]
    return PackageJob(
        name="patchelf",
        version=out[-1] if out else "0",
        build_string="h${{ hash }}_0",
        manifest={"files": files},
        identity=stat_identity(files),
        summary="patchelf from the host (extforge mirror)",
        license="GPL-3.0-or-later",
    )
