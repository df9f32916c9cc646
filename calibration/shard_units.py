#!/usr/bin/env python3
"""What splitting flash-attn units in two translation units costs: each unit compiled unsplit and
as its two halves (recipe/flash-attn/shard_units.py), all at once, with torch's nvcc flags.

  calibration/shard_units.py SDIST [--python PY] [--arch 90] [--unit STEM ...] [--node WORDS] [--no-record]

Prints per unit the unsplit seconds, the halves, and the `shards` model values they imply
(repeated: the share of the unit each half repeats; twin_share: the second half's share of the
rest), the numbers recipe/flash-attn/build-costs.json keeps. Run it on a node with at least three
cores per unit, so that the compiles do not wait for each other.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# _record and _sdist: shared with the bench scripts (the history's sections, the unpacked sdist).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _record import append_section
from _sdist import unpack

RECIPE = Path(__file__).resolve().parents[1] / "recipe" / "flash-attn"
DEFAULT_UNITS = ["flash_fwd_hdim128_fp16_sm80", "flash_fwd_hdim128_fp16_causal_sm80",
                 "flash_bwd_hdim128_fp16_causal_sm80", "flash_fwd_split_hdim128_fp16_causal_sm80"]


def nvcc_command(python: str, arch: str) -> list[str]:
    """nvcc with the flags torch's BuildExtension and flash-attn's setup.py pass (one arch, one thread)."""
    probe = ("import json, sysconfig, torch; from torch.utils import cpp_extension as ce; "
             "print(json.dumps([ce.include_paths(), sysconfig.get_paths()['include'], int(torch._C._GLIBCXX_USE_CXX11_ABI)]))")
    includes, py_include, abi = json.loads(subprocess.run([python, "-c", probe], check=True, capture_output=True,
                                                          text=True).stdout)
    # The standard the recipe compiles with: upstream's c++17, or what torch's headers require (2.14: c++20).
    std = subprocess.run([python, str(RECIPE / "torch_cxx_std.py"), "g++"], check=True, capture_output=True,
                         text=True).stdout.strip()
    std = std if std not in ("c++11", "c++14") else "c++17"
    return ["nvcc", "-Icsrc/flash_attn", "-Icsrc/flash_attn/src", "-Icsrc/cutlass/include",
            *[f"-I{i}" for i in [*includes, py_include]], "-O3", f"-std={std}", "--expt-relaxed-constexpr",
            "--expt-extended-lambda", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "--compiler-options=-fPIC", "-gencode", f"arch=compute_{arch},code=sm_{arch}", "--threads", "1",
            "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]


def compile_all(jobs: dict[str, tuple[Path, str]], nvcc: list[str]) -> dict[str, float]:
    """Every (source tree, unit) at once; seconds per job."""
    start, procs, seconds = {}, {}, {}
    for key, (src, unit) in jobs.items():
        start[key] = time.monotonic()
        procs[key] = subprocess.Popen([*nvcc, "-c", f"csrc/flash_attn/src/{unit}.cu", "-o", f"{unit}.o"], cwd=src,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pending = dict(procs)
    while pending:
        for key, proc in list(pending.items()):
            if proc.poll() is not None:
                seconds[key] = time.monotonic() - start[key]
                del pending[key]
                if proc.returncode:
                    raise SystemExit(f"nvcc {key} failed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.5)
    return seconds


def model(unsplit: float, unit: float, twin: float) -> tuple[float, float]:
    """(repeated, twin_share) such that the halves are c*(r + (1-r)*(1-s)) and c*(r + (1-r)*s)."""
    repeated = (unit + twin) / unsplit - 1
    return repeated, (twin - unsplit * repeated) / (unsplit * (1 - repeated))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path)
    ap.add_argument("--python", default=sys.executable, help="python with torch (its headers and C++ ABI)")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--unit", action="append", help="a unit to measure (repeatable); default: one of each kind, head dim 128")
    ap.add_argument("--node", default="", help="the machine, in words")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    units = args.unit or DEFAULT_UNITS
    if shutil.which("nvcc") is None:
        raise SystemExit("nvcc is not on PATH")
    base = Path(tempfile.mkdtemp(prefix="split-units-"))
    whole = unpack(args.sdist.resolve(), base / "whole", args.python)
    split = unpack(args.sdist.resolve(), base / "split", args.python, split=";".join(units))
    jobs = {f"{u}": (whole, u) for u in units}
    jobs |= {f"{u} unit": (split, u) for u in units} | {f"{u} twin": (split, f"{u}_shard1") for u in units}
    t0 = time.monotonic()
    seconds = compile_all(jobs, nvcc_command(args.python, args.arch))
    wall = time.monotonic() - t0
    rows = ["| unit | unsplit s | unit half s | twin half s | repeated | twin_share |", "|---|---:|---:|---:|---:|---:|"]
    for u in units:
        r, s = model(seconds[u], seconds[f"{u} unit"], seconds[f"{u} twin"])
        rows.append(f"| {u} | {seconds[u]:.1f} | {seconds[f'{u} unit']:.1f} | {seconds[f'{u} twin']:.1f} | {r:.2f} | {s:.2f} |")
    print("\n".join(rows))
    print(f"{len(jobs)} compiles at once, {wall:.0f} s; build folders: {base}")
    if not args.no_record:
        append_section([f"## Split units, unsplit and halves compiled at once ({dt.date.today().isoformat()})\n",
                        f"Node: {args.node or f'{os.cpu_count()} cores'}. `calibration/shard_units.py`, sm_{args.arch}, "
                        f"{len(jobs)} nvcc compiles at once.\n", *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
