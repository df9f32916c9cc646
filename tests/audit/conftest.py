"""Real binaries for the audit tests, compiled once per session with g++ and nvcc.

Each planted defect lives in its own small shared object; nothing is mocked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from extforge.paths import cache_root

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"

TARGET_V1 = r"""
#include <string>
namespace greeter {
std::string greet(const std::string& who) { return "hello " + who; }
int add(int a, int b) { return a + b; }
}
"""
# v2 of the same library (same soname) adds a function v1 lacks: version skew.
TARGET_V2 = TARGET_V1 + r"""
namespace greeter { int added_in_v2(int x) { return 2 * x; } }
"""
EXT = r"""
#include <string>
namespace greeter { std::string greet(const std::string&); int add(int, int); int added_in_v2(int); }
extern "C" int ext_entry(int n) {
  std::string s = greeter::greet(std::to_string(n));
  int r = greeter::add(static_cast<int>(s.size()), n);
#ifdef USE_V2
  r += greeter::added_in_v2(n);
#endif
  return r;
}
"""
# Streams pull the locale machinery in: linked from libstdc++.a, the module exports it.
EXT_STREAMS = r"""
#include <sstream>
#include <string>
extern "C" int ext_format(int n) { std::ostringstream out; out << "n=" << n; return (int)out.str().size(); }
"""
KERNEL = r"""
__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
extern "C" void launch_scale(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")


def _gxx(cwd: Path, source: str, out: str, *flags: str) -> Path:
    src = cwd / (out + ".cpp")
    src.write_text(source)
    _run(["g++", "-O1", "-shared", "-fPIC", "-o", out, src.name, *flags], cwd)
    return cwd / out


@pytest.fixture(scope="session")
def elfs(tmp_path_factory) -> dict[str, Path]:
    """libtarget v1/v2 (ABI 1) and extensions built against them, each with one property."""
    root = tmp_path_factory.mktemp("elfs")
    v1, v2 = root / "v1", root / "v2"
    v1.mkdir()
    v2.mkdir()
    _gxx(v1, TARGET_V1, "libtarget.so", "-Wl,-soname,libtarget.so")
    _gxx(v2, TARGET_V2, "libtarget.so", "-Wl,-soname,libtarget.so")
    return {
        "v1": v1,
        "v2": v2,
        "good": _gxx(root, EXT, "ext_good.so", "-L", str(v1), "-ltarget"),
        "old_abi": _gxx(root, EXT, "ext_old_abi.so", "-D_GLIBCXX_USE_CXX11_ABI=0", "-L", str(v1), "-ltarget"),
        "skew": _gxx(root, EXT, "ext_skew.so", "-DUSE_V2", "-L", str(v2), "-ltarget"),
        "static_runtime": _gxx(root, EXT_STREAMS, "ext_static_runtime.so", "-static-libstdc++"),
        "shared_runtime": _gxx(root, EXT_STREAMS, "ext_shared_runtime.so"),
    }


def _nvcc(cwd: Path, out: str, *gencode: str) -> Path:
    src = cwd / "kernel.cu"
    src.write_text(KERNEL)
    _run([NVCC, "-shared", "-Xcompiler", "-fPIC", *gencode, "-o", out, src.name], cwd)
    return cwd / out


@pytest.fixture(scope="session")
def cuda_elfs(tmp_path_factory) -> dict[str, Path]:
    if not Path(NVCC).exists():
        pytest.skip("nvcc is not installed")
    root = tmp_path_factory.mktemp("cuda")
    return {
        "sm80": _nvcc(root, "k_sm80.so", "-gencode", "arch=compute_80,code=sm_80"),
        "ptx90": _nvcc(root, "k_ptx90.so", "-gencode", "arch=compute_90,code=compute_90"),
    }


def torch_dir(version: str, *extra: str, wheels: Path | None = None) -> Path:
    """A torch wheel (no deps, plus `extra` wheels) installed once into the extforge cache, from
    the folder `wheels` when given (no index)."""
    dest = cache_root() / "audit-torch" / version
    if not (dest / "torch" / "lib").is_dir():
        tmp = dest.with_name(version + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        where = ["--no-index", "--find-links", str(wheels)] if wheels else []
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *where, "--target", str(tmp),
                        f"torch=={version}", *extra], check=True)
        tmp.rename(dest)
    return dest


# at::linalg_matrix_sqrth is new in torch 2.14: the CPU 2.13.0 wheel lacks its operator.
TORCH_EXT = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/linalg_matrix_sqrth.h>
#include <c10/util/Exception.h>

at::Tensor matrix_sqrth(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "expected a matrix, got ", x.dim(), " dims");
  return at::linalg_matrix_sqrth(x);
}
"""


@pytest.fixture(scope="session")
def torch_ext(tmp_path_factory):
    from extforge import mirror

    # The mirror fixture's download of the same torch (the session's start begins it): its 900 MB
    # wheel fetched once. libtorch_cpu of the cu130 wheel needs libcudart and libcupti from the
    # nvidia wheels.
    wheels = mirror.from_pip(mirror.pip_requirements("torch==2.14.1", []))
    new = torch_dir("2.14.1", "nvidia-cuda-runtime", "nvidia-cuda-cupti", wheels=wheels.artifacts["torch"].wheel.parent)
    old = torch_dir("2.13.0")
    root = tmp_path_factory.mktemp("torch_ext")
    (root / "ext.cpp").write_text(TORCH_EXT)
    lib = new / "torch" / "lib"
    subprocess.run(["g++", "-O1", "-std=c++20", "-shared", "-fPIC", "-I", str(new / "torch" / "include"),
                    "ext.cpp", "-o", "ext.so", "-L", str(lib), "-lc10", "-ltorch_cpu"], cwd=root, check=True)
    return root / "ext.so", new, old
