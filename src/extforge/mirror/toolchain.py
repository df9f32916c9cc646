"""Compiler activation packages (conda-forge names) that point at the host's gcc and CUDA toolkit.

Recipes stay written as for conda-forge (`${{ compiler('cxx') }}`, `${{ compiler('cuda') }}`
with `cuda_compiler: cuda-nvcc`); these shims make those names resolve offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..archive import member_refusal, unsafe_reason
from ..doctor.compiler import parse_print_file_name
from ..errors import ExtforgeError
from ..ui import log
from .hashing import sha256_file, stat_identity, text_identity
from .inputs import MirrorInputs
from .recipes import PackageJob

DISTRO_GXX = "/usr/bin/g++"
HEADER_DIR = re.compile(r"^nvidia/[^/]+/include/")
TARGET_INCLUDE = "targets/x86_64-linux/include"


@dataclass(frozen=True)
class Toolchain:
    gcc: str
    gxx: str
    gcc_version: str  # 12.2.0
    cuda_home: str | None
    nvcc_version: str | None  # 13.0.88

    @property
    def gcc_major(self) -> str:
        return self.gcc_version.split(".")[0]

    @property
    def cuda_short(self) -> str | None:
        return ".".join(self.nvcc_version.split(".")[:2]) if self.nvcc_version else None


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
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not cuda_home and Path("/usr/local/cuda/bin/nvcc").exists():
        cuda_home = "/usr/local/cuda"
    if not cuda_home:
        nvcc = shutil.which("nvcc")
        cuda_home = str(Path(nvcc).resolve().parent.parent) if nvcc else None
    nvcc_version = None
    if cuda_home:
        try:
            out = subprocess.run([f"{cuda_home}/bin/nvcc", "--version"], capture_output=True, text=True).stdout
            nvcc_version = parse_nvcc_version(out)
        except OSError:
            cuda_home = None
    return Toolchain(gcc, gxx, gcc_version or "0.0.0", cuda_home, nvcc_version)


def _activation(name: str, body: str) -> list[str]:
    return [f"etc/conda/activate.d/extforge-{name}.sh", body, "644"]


# The script finds its own prefix: rattler-build stacks host and build activations.
_SELF_PREFIX = '_ef_prefix="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../../.." && pwd)"\n'


def shim(name: str, version: str, body: str, depends: list[str] | None = None) -> PackageJob:
    texts = [_activation(name, body)]
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
    if tc.cuda_home and tc.nvcc_version:
        short = tc.cuda_short
        major, minor = short.split(".")  # type: ignore[union-attr]
        version_pin = f"cuda-version >={short},<{major}.{int(minor) + 1}.0a0"
        nvcc_body = (
            f'export CUDA_HOME="${{EXTFORGE_CUDA_HOME:-{tc.cuda_home}}}"\n'
            'export CUDA_PATH="$CUDA_HOME"\n'
            'export PATH="$CUDA_HOME/bin:$PATH"\n'
            f'export NVCC_CCBIN="{tc.gxx}"\n'
        )
        jobs += [
            PackageJob(
                name="cuda-version",
                version=short,  # type: ignore[arg-type]
                build_string="h${{ hash }}_0",
                constrains=[f"__cuda >={major}"],
                identity=short or "",
                summary="Pins the CUDA version a channel's packages were built for",
                license="BSD-3-Clause",
            ),
            shim("cuda-nvcc_linux-64", tc.nvcc_version, nvcc_body, [version_pin, "cuda-libraries-dev"]),
            shim("cuda-nvcc", tc.nvcc_version, "", [f"cuda-nvcc_linux-64 =={tc.nvcc_version}", version_pin]),
        ]
    patchelf = patchelf_job()
    return jobs + ([patchelf] if patchelf else [])


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


def headers_job(inputs: MirrorInputs, cuda_short: str) -> PackageJob:
    """`cuda-libraries-dev`: the cublas/cusparse/... headers of the nvidia wheels.

    Some toolkits (a CI image's) ship nvcc without the math library headers that torch's
    ATen/cuda headers include; the nvidia wheels carry them under nvidia/<lib|cuXX>/include.
    """
    files: list[list[str]] = []
    wheels = [a.wheel for a in inputs.artifacts.values() if a.wheel is not None and a.name.startswith("nvidia-")]
    identity = ""
    if wheels:
        identity = text_identity(*sorted(sha256_file(w) for w in wheels))
        root = paths.cache_root() / "mirror" / "headers" / identity[:24]
        if not (root / ".complete").exists():
            for whl in wheels:
                with zipfile.ZipFile(whl) as zf:
                    for member in zf.namelist():
                        if HEADER_DIR.match(member) and not member.endswith("/"):
                            if reason := unsafe_reason(HEADER_DIR.sub("", member)):
                                raise member_refusal(whl.name, member, reason, "wheel")
                            out = root / HEADER_DIR.sub("", member)
                            out.parent.mkdir(parents=True, exist_ok=True)
                            out.write_bytes(zf.read(member))
            root.mkdir(parents=True, exist_ok=True)
            (root / ".complete").touch()
        sources = [root]
    else:
        sources = []
        for site in {a.installed["site_dir"] for a in inputs.artifacts.values() if a.installed}:
            sources += sorted(Path(site).glob("nvidia/*/include"))
    for src_root in sources:
        for dirpath, _, filenames in os.walk(src_root):
            for fn in filenames:
                if fn == ".complete" or fn == "__init__.py":
                    continue
                src = Path(dirpath) / fn
                files.append([str(src), f"{TARGET_INCLUDE}/{src.relative_to(src_root).as_posix()}", ""])
    body = (
        _SELF_PREFIX + f'export CPATH="$_ef_prefix/{TARGET_INCLUDE}${{CPATH:+:$CPATH}}"\n'
        f'export NVCC_PREPEND_FLAGS="${{NVCC_PREPEND_FLAGS:-}} -I$_ef_prefix/{TARGET_INCLUDE}"\n'
        "unset _ef_prefix\n"
    )
    return PackageJob(
        name="cuda-libraries-dev",
        version=cuda_short,
        build_string="h${{ hash }}_0",
        manifest={"files": files, "texts": [_activation("cuda-libraries-dev", body)]},
        identity=identity or stat_identity(files),
        size_hint=sum(os.path.getsize(f[0]) for f in files),
        summary="CUDA math library headers from the nvidia wheels (extforge mirror)",
        license="LicenseRef-NVIDIA-End-User-License-Agreement",
    )
