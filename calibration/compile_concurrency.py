#!/usr/bin/env python3
"""How much slower one flash-attn unit compiles when more compile at once, on one node.

  calibration/compile_concurrency.py SDIST [--unit NAME] [--levels 32,16,1] [--arch 90] [--budget S]
                               [--torch-include DIR ...] [--json-out FILE]

The planner's concurrency slowdown (recipe/flash-attn/build-costs.json `per_compile`) was fitted from builds on
different nodes, so a node's speed and the compiles beside it cannot be told apart there. This
compiles the same unit of the flash-attn sdist N times at once for each level, with upstream's
nvcc flags and the node's torch headers, on one machine, and fits the slowdown per extra compile
from the levels alone. Levels run in the order given while the budget lasts (a level that would
end past it is skipped), so the most telling one goes first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

# flash-attn 2.8.3's setup.py: its nvcc flags, and what torch's BuildExtension adds to each .cu.
UPSTREAM_NVCC = ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                 "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
                 "--expt-extended-lambda", "--use_fast_math"]
TORCH_NVCC = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "--compiler-options", "-fPIC", "-DTORCH_API_INCLUDE_EXTENSION_H",
              "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda"]


def torch_includes() -> tuple[list[str], str]:
    """The include folders and C++ ABI flag of this python's torch."""
    import torch
    from torch.utils import cpp_extension

    try:
        paths = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # torch < 2.6
        paths = cpp_extension.include_paths(cuda=True)
    return list(paths), f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def nvcc_command(src: Path, out: Path, root: Path, arch: str, includes: list[str], abi: str, std: str) -> list[str]:
    flags = [f if f != "-std=c++17" else f"-std={std}" for f in UPSTREAM_NVCC]
    inc = [f"-I{p}" for p in (root / "csrc/flash_attn", root / "csrc/flash_attn/src", root / "csrc/cutlass/include",
                              *includes, sysconfig.get_paths()["include"])]
    return ["nvcc", *inc, "-c", str(src), "-o", str(out), *TORCH_NVCC, abi, *flags,
            "-gencode", f"arch=compute_{arch},code=sm_{arch}", "--threads", "1"]


def run_level(n: int, command: list[str], out_dir: Path) -> list[float]:
    """Start n copies at once (each its own object file); the seconds each took."""
    procs = []
    for i in range(n):
        cmd = [*command]
        cmd[cmd.index("-o") + 1] = str(out_dir / f"copy{i}.o")
        procs.append((time.monotonic(), subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    seconds = []
    for t0, p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"nvcc failed (exit {p.returncode}):\n{err.decode(errors='replace')[-3000:]}")
        seconds.append(time.monotonic() - t0)
    return seconds


def fit_per_compile(medians: dict[int, float]) -> float | None:
    """The slope k of t(c) = t1 * (1 + k * (c - 1)) through the levels (least squares on t(c) / t(c_min))."""
    if len(medians) < 2:
        return None
    levels = sorted(medians)
    base_c, base_t = levels[0], medians[levels[0]]
    # t(c)/t(b) = (1 + k(c-1)) / (1 + k(b-1)): solve each pair for k, weight by the spread in c.
    ks = []
    for c in levels[1:]:
        r = medians[c] / base_t
        denom = (c - 1) - r * (base_c - 1)
        if denom > 0:
            ks.append(((r - 1) / denom, c - base_c))
    return sum(k * w for k, w in ks) / sum(w for _, w in ks) if ks else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sdist", type=Path)
    ap.add_argument("--unit", default="flash_fwd_hdim32_bf16_causal_sm80", help="the .cu to compile (its cheapest unit)")
    ap.add_argument("--levels", default="32,16,1", help="compiles at once, in the order to run them")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--std", default="c++17", help="C++ standard (torch >= 2.13 needs c++20)")
    ap.add_argument("--budget", type=float, default=420, help="seconds for all levels")
    ap.add_argument("--torch-include", action="append", help="torch's include folders (default: this python's torch)")
    ap.add_argument("--abi", default=None, help="-D_GLIBCXX_USE_CXX11_ABI=N (default: this python's torch)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget
    if args.torch_include:
        includes, abi = args.torch_include, args.abi or "-D_GLIBCXX_USE_CXX11_ABI=1"
    else:
        includes, abi = torch_includes()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    result: dict = {"unit": args.unit, "arch": args.arch, "cpus": os.cpu_count(), "levels": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with tarfile.open(args.sdist) as tf:
            tf.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        root = next(work.glob("flash_attn-*"))
        command = nvcc_command(root / "csrc/flash_attn/src" / f"{args.unit}.cu", work / "x.o", root, args.arch,
                               includes, abi, args.std)
        print(" ".join(command), flush=True)
        longest = 0.0
        for n in levels:
            # Levels run from the most compiles at once down: the next one takes no longer than the last.
            if time.monotonic() + longest > deadline:
                print(f"{n} at once: skipped (would end past the budget)", flush=True)
                continue
            seconds = run_level(n, command, work)
            longest = max(longest, max(seconds))
            result["levels"][str(n)] = {"median_s": round(statistics.median(seconds), 1),
                                        "min_s": round(min(seconds), 1), "max_s": round(max(seconds), 1)}
            print(f"{n} at once: median {statistics.median(seconds):.1f} s (min {min(seconds):.1f}, max {max(seconds):.1f})",
                  flush=True)
            if args.json_out:
                args.json_out.write_text(json.dumps(result, indent=1))
    k = fit_per_compile({int(n): v["median_s"] for n, v in result["levels"].items()})
    result["per_compile"] = None if k is None else round(k, 4)
    print(f"slowdown per extra compile: {k:.4f}" if k is not None else "slowdown: needs two levels", flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
