"""The CUDA toolkit of a mirror channel as conda packages with conda-forge's names.

A toolkit, wherever it came from (NVIDIA's wheels, Debian's packages, a host's install), is
first laid out like an NVIDIA toolkit (`bin/`, `nvvm/`, `targets/x86_64-linux/{include,lib}`);
this module chooses one for a torch and splits that layout into packages. Fetching lives in
cuda_sources.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..cuda_rule import version_key
from .hashing import text_identity
from .recipes import PackageJob
from .toolchain import activation

TARGET = "targets/x86_64-linux"
INCLUDE = f"{TARGET}/include"
LIB = f"{TARGET}/lib"
CCCL_DIRS = ("cub/", "thrust/", "cuda/", "nv/", "cccl/")
# Headers of the math libraries that torch's ATen/cuda headers include.
MATH_HEADER = re.compile(r"^(cublas|cusparse|cusolver|curand|cufft|nvjitlink)", re.I)
NVCC_TOOLS = ("nvcc", "ptxas", "fatbinary", "nvlink", "cudafe++", "bin2c", "cuobjdump", "nvdisasm", "cu++filt")
# The runtime libraries nvcc links: libcudart.so for extensions (-lcudart), the static runtime and
# device runtime for anything nvcc links itself (its default is -cudart static).
CUDART_LIBS = ("libcudart.so", "libcudart_static.a", "libcudadevrt.a")
NVIDIA_EULA = "LicenseRef-NVIDIA-End-User-License-Agreement"




@dataclass
class Toolkit:
    """A toolkit laid out like NVIDIA's: relative path in the layout -> file (or symlink) providing it."""

    version: str  # full: 12.4.131
    source: str  # wheels | debian | host
    origin: str  # what it was made from, for package summaries ("Debian trixie nvidia-cuda-toolkit 12.4.131~12.4.1-2")
    files: dict[str, Path] = field(default_factory=dict)
    identity: str = ""  # content identity of the inputs (download sha256s, or file stats for a host)

    @property
    def short(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def major(self) -> int:
        return version_key(self.version)[0]






def nvcc_profile(has_cccl_dir: bool) -> str:
    """nvcc.profile beside bin/nvcc, relative to itself: the package works from any prefix."""
    lines = [
        "TOP = $(_HERE_)/..",
        "NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice",
        "LD_LIBRARY_PATH += $(TOP)/lib:",
        "PATH += $(TOP)/nvvm/bin:$(_HERE_):",
        f'INCLUDES += "-I$(TOP)/{INCLUDE}" $(_SPACE_)',
    ]
    if has_cccl_dir:  # CUDA 13 keeps CCCL in include/cccl
        lines.append(f'SYSTEM_INCLUDES += "-isystem" "$(TOP)/{INCLUDE}/cccl" $(_SPACE_)')
    lines.append(f'LIBRARIES =+ $(_SPACE_) "-L$(TOP)/{LIB}/stubs" "-L$(TOP)/{LIB}"')
    return "\n".join(lines) + "\n"


def package_of(rel: str) -> str | None:
    """Which package of the set a file of the layout belongs to (None: not packaged)."""
    if rel.startswith(("bin/", "nvvm/")):
        return "cuda-nvcc-tools"
    if rel.startswith(LIB + "/"):
        return "cuda-cudart-dev"
    if rel.startswith(INCLUDE + "/"):
        inner = rel[len(INCLUDE) + 1 :]
        if inner.startswith(CCCL_DIRS):
            return "cuda-cccl"
        if MATH_HEADER.match(inner):
            return "cuda-libraries-dev"
        return "cuda-cudart-dev"
    return None


# The activation finds its own prefix: rattler-build stacks host and build activations.
_SELF_PREFIX = '_ef_prefix="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../../.." && pwd)"\n'


def nvcc_activation(tk: Toolkit, gxx: str) -> str:
    include = f"$_ef_prefix/{INCLUDE}"
    cpath = include + (f":{include}/cccl" if any(r.startswith(f"{INCLUDE}/cccl/") for r in tk.files) else "")
    return (
        _SELF_PREFIX
        + 'export CUDA_HOME="$_ef_prefix"\n'
        'export CUDA_PATH="$CUDA_HOME"\n'
        'export PATH="$CUDA_HOME/bin:$PATH"\n'
        # host compilers see the toolkit's headers too: torch's .cpp files include cuda_runtime_api.h
        f'export CPATH="{cpath}${{CPATH:+:$CPATH}}"\n'
        f'export NVCC_CCBIN="{gxx}"\n'
        "unset _ef_prefix\n"
    )


def toolkit_jobs(tk: Toolkit, gxx: str) -> list[PackageJob]:
    """cuda-version, cuda-nvcc-tools, cuda-cudart-dev, cuda-cccl, cuda-libraries-dev,
    cuda-nvcc_linux-64 (activation: CUDA_HOME is the build prefix) and cuda-nvcc."""
    major = tk.major
    short = tk.short
    version_pin = f"cuda-version >={short},<{major + 1}.0a0"
    exact = f"=={tk.version}"
    by_package: dict[str, list[list[str]]] = {}
    for rel, src in sorted(tk.files.items()):
        name = package_of(rel)
        if name:
            by_package.setdefault(name, []).append([str(src), rel, "L"])
    has_cccl_dir = any(r.startswith(f"{INCLUDE}/cccl/") for r in tk.files)
    symlinks = cudart_links(tk)
    summary = f"from {tk.origin} (extforge mirror)"

    def job(name: str, depends: list[str], texts: list[list[str]] | None = None,
            links: list[list[str]] | None = None, strong: list[str] | None = None) -> PackageJob:
        files = by_package.get(name, [])
        return PackageJob(
            name=name,
            version=tk.version,
            build_string=f"{tk.source}_h${{{{ hash }}}}_0",
            depends=depends,
            strong_run_exports=strong or [],
            manifest={"files": files, "texts": texts or [], "symlinks": links or []},
            identity=text_identity(tk.identity, *(f"{d}\0{s}" for s, d, _ in files)),
            size_hint=sum(os.lstat(s).st_size for s, _, _ in files),
            summary=f"CUDA {tk.version} {name.removeprefix('cuda-')} {summary}",
            license=NVIDIA_EULA,
        )

    return [
        PackageJob(
            name="cuda-version",
            version=short,
            build_string="h${{ hash }}_0",
            constrains=[f"__cuda >={major}"],
            identity=short,
            summary="Pins the CUDA version a channel's packages were built for",
            license="BSD-3-Clause",
        ),
        job("cuda-nvcc-tools", depends=[version_pin], texts=[["bin/nvcc.profile", nvcc_profile(has_cccl_dir), "644"]]),
        job("cuda-cudart-dev", depends=[version_pin], links=symlinks),
        job("cuda-cccl", depends=[version_pin]),
        job("cuda-libraries-dev", depends=[version_pin, f"cuda-cudart-dev {exact}"]),
        job(
            "cuda-nvcc_linux-64",
            depends=[version_pin] + [f"{n} {exact}" for n in
                                     ("cuda-nvcc-tools", "cuda-cudart-dev", "cuda-cccl", "cuda-libraries-dev")],
            texts=[activation("cuda-nvcc", nvcc_activation(tk, gxx))],
            # As on conda-forge: what this nvcc compiled needs CUDA of its major, at least its minor.
            strong=[version_pin],
        ),
        job("cuda-nvcc", depends=[f"cuda-nvcc_linux-64 {exact}", version_pin]),
    ]


def cudart_links(tk: Toolkit) -> list[list[str]]:
    """`libcudart.so` for `-lcudart` where the source has only the versioned file (NVIDIA's wheels),
    and in `lib/`, where torch's cpp_extension looks when CUDA_HOME has no lib64."""
    names = sorted(r.rsplit("/", 1)[1] for r in tk.files if r.startswith(f"{LIB}/libcudart.so"))
    links = []
    if names and "libcudart.so" not in names:
        links.append([f"{LIB}/libcudart.so", names[-1]])
    if names:
        links.append(["lib/libcudart.so", f"../{LIB}/libcudart.so"])
    return links




