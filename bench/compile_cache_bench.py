"""Cold vs warm compile of a small torch CUDA extension through extforge.compile_cache.

Builds the same extension (one .cpp binding + one .cu kernel, torch's ninja build) twice, in two
different directories, sharing one empty compile cache: the first build fills it (cold), the
second (warm) shows what a rebuild of a variant in a fresh rattler-build work dir gets back.
Both directories sit at the same depth, as rattler-build's timestamped work dirs do: with
base_dir "/" ccache keys on paths relative to the working directory.
The compiler wiring is the one recipe/flash-attn/build.sh does: PYTORCH_NVCC = launcher + nvcc,
CXX = a wrapper script, plus LDFLAGS with -Wl,--no-undefined and libpython, checked to reach
the link line.

    python bench/compile_cache_bench.py --python /path/to/env-with-torch/bin/python [--tool ccache]

With --project SDIST it builds a real project's sdist instead (`setup.py build_ext --inplace`),
e.g. flash-attn on a GPU build node:

    python bench/compile_cache_bench.py --python python3 --project flash_attn-2.8.3.tar.gz \
        --jobs 16 --set FLASH_ATTENTION_FORCE_BUILD=TRUE --set FLASH_ATTN_CUDA_ARCHS=90 \
        --set NVCC_THREADS=1 --keep-so OUT/

Appends a dated section to docs/benchmarks-history.md unless --no-record; --json-out writes the results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _record import append_section

from extforge import compile_cache
from extforge.machine import detect
from extforge.mirror.toolchain import pick_compilers

# The kernel includes torch's tensor headers, not torch/extension.h (which pulls in Python.h),
# as flash-attn's .cu units do: only the binding depends on the Python version.
KERNEL = r"""
#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>
__global__ void axpy_kernel(float a, const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
void axpy_cuda(double a, const at::Tensor& x, at::Tensor& y) {
  int64_t n = x.numel();
  axpy_kernel<<<(n + 255) / 256, 256>>>((float)a, x.data_ptr<float>(), y.data_ptr<float>(), n);
}
"""
BINDING = r"""
#include <torch/extension.h>
void axpy_cuda(double a, const at::Tensor& x, at::Tensor& y);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("axpy", &axpy_cuda); }
"""
SETUP = r"""
import glob, os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension
import nvidia
# torch's pip wheels ship the CUDA headers that a bare toolkit may lack (cublas, cusparse).
extra = [p for p in glob.glob(os.path.join(os.path.dirname(nvidia.__path__[0] + "/"), "cu*", "include"))]
setup(name="axpy_ext", ext_modules=[CUDAExtension("axpy_ext", ["binding.cpp", "kernel.cu"],
      include_dirs=extra, extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2", "-gencode", "arch=compute_90,code=sm_90"]})],
      cmdclass={"build_ext": BuildExtension})
"""


def _write_ext(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "kernel.cu").write_text(KERNEL)
    (where / "binding.cpp").write_text(BINDING)
    (where / "setup.py").write_text(SETUP)
    return where


def _unpack_project(sdist: Path, where: Path) -> Path:
    """The sdist's top folder, unpacked under `where` (same name, so same depth, every time)."""
    where.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        tf.extractall(where, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (top,) = [p for p in where.iterdir() if p.is_dir()]
    return top


def _build_env(python: str, cache_env: dict[str, str], wrap_dir: Path, jobs: int, real_cxx: str) -> dict[str, str]:
    env = dict(os.environ) | cache_env
    launcher = cache_env["EXTFORGE_COMPILER_LAUNCHER"]
    wrap_dir.mkdir(parents=True, exist_ok=True)
    wrapper = wrap_dir / Path(real_cxx).name
    wrapper.write_text(f'#!/bin/sh\nexec {launcher} {real_cxx} "$@"\n')
    wrapper.chmod(0o755)
    # torch guesses CUDA_HOME from `which nvcc`; with nvcc behind PYTORCH_NVCC it must be told.
    cuda_home = env.setdefault("CUDA_HOME", "/usr/local/cuda")
    libdir, soname = subprocess.check_output(
        [python, "-c", "import sysconfig as s; print(s.get_config_var('LIBDIR'), s.get_config_var('INSTSONAME'))"],
        text=True,
    ).split()
    # As recipe/flash-attn/build.sh does: torch imported through a link without the Python
    # version in its name, so its include paths preprocess alike for every Python version.
    site = wrap_dir.parent / ".extforge-site"
    site.symlink_to(subprocess.check_output(
        [python, "-c", "import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec('torch').origin)))"],
        text=True).strip())
    env |= {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
        "CXX": str(wrapper),
        "PYTORCH_NVCC": f"{launcher} {cuda_home}/bin/nvcc",
        "TORCH_NO_COMPILER_WRAPPER": "1",
        "MAX_JOBS": str(jobs),
        "LDFLAGS": f"-Wl,--no-undefined -L{libdir} -Wl,--push-state,--no-as-needed -l:{soname} -Wl,--pop-state",
    }
    return env


def _stats(launcher: str, env: dict[str, str]) -> dict[str, int]:
    if Path(launcher).name.startswith("ccache"):
        text = subprocess.check_output([launcher, "--print-stats"], env=env, text=True)
        values = dict(line.split("\t") for line in text.splitlines() if "\t" in line)
        hits = int(values.get("direct_cache_hit", 0)) + int(values.get("preprocessed_cache_hit", 0))
        return {"hits": hits, "misses": int(values.get("cache_miss", 0))}
    stats = json.loads(subprocess.check_output([launcher, "--show-stats", "--stats-format=json"], env=env, text=True))
    return {"hits": sum(stats["stats"]["cache_hits"]["counts"].values()),
            "misses": sum(stats["stats"]["cache_misses"]["counts"].values())}


def _build(python: str, src: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run([python, "setup.py", "build_ext", "--inplace", "-v"], cwd=src, env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"build in {src} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return seconds, proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="python of an environment with torch (CUDA build)")
    ap.add_argument("--warm-python", help="another Python version with the same torch for the warm build "
                                          "(does a second Python version reuse the kernel objects?)")
    ap.add_argument("--tool", choices=compile_cache.TOOLS, default=None)
    ap.add_argument("--project", type=Path, help="an sdist to build instead of the small extension")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra build environment")
    ap.add_argument("--jobs", type=int, default=2, help="MAX_JOBS for torch's ninja build")
    ap.add_argument("--keep-so", type=Path, help="copy the cold build's extension modules here")
    ap.add_argument("--json-out", type=Path, help="write the results as JSON here")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()
    extra_env = dict(kv.split("=", 1) for kv in args.set)

    with tempfile.TemporaryDirectory(prefix="extforge-ccbench-") as tmp:
        root = Path(tmp)
        cache_env = compile_cache.env(args.tool, cache_dir=root / "cache")
        launcher = cache_env["EXTFORGE_COMPILER_LAUNCHER"]
        results = []
        # The g++ the mirror's compiler packages use: one that links the shared libstdc++.
        real_cxx = pick_compilers()[1]
        for label, where, python in (("cold", root / "work-1" / "ext", args.python),
                                     ("warm", root / "work-2" / "ext", args.warm_python or args.python)):
            src = _unpack_project(args.project, where) if args.project else _write_ext(where)
            env = _build_env(python, cache_env, where / ".bin", args.jobs, real_cxx) | extra_env
            before = _stats(launcher, env)
            seconds, log = _build(python, src, env)
            after = _stats(launcher, env)
            link_ok = "-Wl,--no-undefined" in log
            py_version = subprocess.check_output([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], text=True).strip()
            results.append({"run": label, "python": py_version, "seconds": round(seconds, 1),
                            "hits": after["hits"] - before["hits"], "misses": after["misses"] - before["misses"],
                            "no_undefined_on_link_line": link_ok})
            print(json.dumps(results[-1]), flush=True)
            if not link_ok:
                sys.exit("LDFLAGS did not reach the link line")
            if label == "cold" and args.keep_so:
                args.keep_so.mkdir(parents=True, exist_ok=True)
                for so in src.glob("*.so"):
                    shutil.copy2(so, args.keep_so / so.name)

    torch_version = subprocess.check_output([args.python, "-c", "import torch; print(torch.__version__)"], text=True).strip()
    machine = detect()
    tool = Path(launcher).name
    version = subprocess.check_output([launcher, "--version"], text=True).splitlines()[0]
    what = (f"`{args.project.name}` (`setup.py build_ext --inplace`, {' '.join(args.set) or 'no extra settings'})"
            if args.project else
            "a torch CUDAExtension with 2 translation units (one .cpp pybind binding including "
            "torch/extension.h, one .cu kernel for sm_90), built with `setup.py build_ext`")
    if args.json_out:
        args.json_out.write_text(json.dumps({"what": what, "tool": version, "torch": torch_version,
                                             "jobs": args.jobs, "results": results}, indent=2))
    if not args.no_record:
        lines = [
            f"\n## Compile cache, cold vs warm ({dt.date.today().isoformat()})\n",
            f"Machine: {machine.cores} cores, {machine.memory_gib:.0f} GiB, {platform.machine()}; "
            f"{version}; torch {torch_version}; nvcc from CUDA_HOME; MAX_JOBS={args.jobs}.\n",
            f"{what[0].upper()}{what[1:]}, through "
            f"`extforge.compile_cache.env()` ({tool}, base_dir /) twice, in two different directories "
            "sharing one cache: `bench/compile_cache_bench.py`.\n",
            "| run | python | wall s | cache hits | misses |",
            "|---|---|---|---|---|",
            *[f"| {r['run']} | {r['python']} | {r['seconds']} | {r['hits']} | {r['misses']} |" for r in results],
        ]
        append_section(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
