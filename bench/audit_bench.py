"""How long `extforge audit` takes on large extension modules.

Two inputs, both audited against torch 2.14.1 (+ its CUDA runtime wheels) from the
extforge cache (installed there by the audit tests' torch fixture or by this script):
  - synthetic: a torch extension (g++, links libc10/libtorch_cpu) whose `.nv_fatbin`
    section holds 72 sm_90 cubin-sized entries, ~216 MB in all, shaped like the 222 MB
    flash-attn 2.8.3 module (72 sm_90 cubins, no PTX);
  - libtorch_cuda.so of the torch wheel (~500 MB, a real fatbin and ~thousands of
    undefined symbols).
Prints one JSON line per input (best and median of --repeat runs, page cache warm) and
appends a dated section to docs/benchmarks-history.md unless --no-record.

    python bench/audit_bench.py [--repeat 3] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from extforge.audit import audit_target
from extforge.machine import detect
from extforge.paths import cache_root

EXT = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/linalg_matrix_sqrth.h>
#include <c10/util/Exception.h>
at::Tensor matrix_sqrth(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "expected a matrix, got ", x.dim(), " dims");
  return at::linalg_matrix_sqrth(x);
}
"""
ENTRIES, ENTRY_BYTES = 72, 3 * 1024 * 1024


def torch_target() -> Path:
    dest = cache_root() / "audit-torch" / "2.14.1"
    if not (dest / "torch" / "lib").is_dir():
        tmp = dest.with_name("2.14.1.tmp")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                        "torch==2.14.1", "nvidia-cuda-runtime", "nvidia-cuda-cupti"], check=True)
        tmp.rename(dest)
    return dest


def fatbin_blob(entries: int, payload: int) -> bytes:
    """One fatbin container with `entries` sm_90 ELF entries of `payload` random bytes."""
    body = bytearray()
    for _ in range(entries):
        body += struct.pack("<HHIQIIHHIIIQQQ", 2, 0x101, 64, payload, payload, 0, 8, 1, 90, 0, 0, 0x11, 0, 0)
        body += os.urandom(payload)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + bytes(body)


def build_synthetic(root: Path, torch: Path) -> Path:
    (root / "fatbin.bin").write_bytes(fatbin_blob(ENTRIES, ENTRY_BYTES))
    (root / "fatbin.S").write_text('.section .nv_fatbin,"a"\n.balign 8\n.incbin "fatbin.bin"\n'
                                   '.section .note.GNU-stack,"",@progbits\n')
    (root / "ext.cpp").write_text(EXT)
    lib = torch / "torch" / "lib"
    subprocess.run(["g++", "-O1", "-std=c++20", "-shared", "-fPIC", "-I", str(torch / "torch" / "include"),
                    "ext.cpp", "fatbin.S", "-o", "big_ext.so", "-L", str(lib), "-lc10", "-ltorch_cpu"],
                   cwd=root, check=True)
    return root / "big_ext.so"


def measure(path: Path, against: Path, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        report = audit_target(path, against=against, archs=["sm_90"])
        times.append(time.perf_counter() - start)
    return {"file": path.name, "mb": round(path.stat().st_size / 1e6), "best_s": round(min(times), 2),
            "median_s": round(statistics.median(times), 2), "sass": report.sass_archs,
            "undefined": sum(m.undefined for m in report.modules), "verdict": report.verdict}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()
    torch = torch_target()
    with tempfile.TemporaryDirectory(prefix="extforge-auditbench-") as tmp:
        results = [measure(build_synthetic(Path(tmp), torch), torch, args.repeat),
                   measure(torch / "torch" / "lib" / "libtorch_cuda.so", torch, args.repeat)]
    for r in results:
        print(json.dumps(r))
    if not args.no_record:
        machine = detect()
        lines = [
            f"\n## Audit of large modules ({dt.date.today().isoformat()})\n",
            f"Machine: {machine.cores} cores, {machine.memory_gib:.0f} GiB, {platform.machine()}, no GPU; "
            f"Python {platform.python_version()}. `bench/audit_bench.py`, `audit_target(..., archs=['sm_90'])` "
            "against torch 2.14.1+cu130 (pip wheel), page cache warm, best/median of "
            f"{args.repeat} runs. Target: < 5 s for the 222 MB flash-attn module.\n",
            "The synthetic module is a torch extension with a `.nv_fatbin` of 72 sm_90 entries (216 MB), "
            "the shape of flash-attn 2.8.3's. libtorch_cuda.so's verdict is fail because the "
            "cuBLAS/cuDNN/NCCL wheels are not installed in that target.\n",
            "| module | MB | undefined symbols | SASS | best s | median s |",
            "|---|---|---|---|---|---|",
            *[f"| {r['file']} | {r['mb']} | {r['undefined']} | {', '.join(r['sass'])} | {r['best_s']} | "
              f"{r['median_s']} |" for r in results],
            "",
        ]
        path = Path(__file__).resolve().parents[1] / "docs" / "benchmarks-history.md"
        with path.open("a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
