#!/usr/bin/env python3
"""How long stamping a flash-attn-sized package takes: `extforge build` writes the audit record
into every package it built, which recompresses the package's payload.

The package is laid out as rattler-build writes one (.conda, zstd level 15 members); its payload
is the first --mib MiB of a real CUDA library (default: libtorch_cuda.so of the audit bench's
torch 2.14.1, or --payload FILE), the size of the full flash-attn 2.8.3 module (212 MiB) and as
compressible as a fatbin. `stamp_package` is timed with one compression thread (what it did
before) and with its default (this machine's cores, at most MAX_ZSTD_THREADS). Prints one JSON
line and appends a dated section to docs/benchmarks-history.md unless --no-record.

    python bench/stamp_bench.py [--payload FILE] [--mib 212] [--repeat 2] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import platform
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import zstandard
from _record import append_section
from audit_bench import torch_target

from extforge.machine import detect
from extforge.stamp import MAX_ZSTD_THREADS, ZSTD_LEVEL, AuditStamp, stamp_package

SO = "lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"


def tar_zst(files: dict[str, bytes], threads: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=threads).compress(raw.getvalue())


def make_package(dest: Path, payload: bytes, threads: int) -> Path:
    stem = "flash-attn-2.8.3-cuda130_torch211_py312_cxx11_h0_0"
    index = {"name": "flash-attn", "version": "2.8.3", "build": "cuda130_torch211_py312_cxx11_h0_0",
             "build_number": 0, "depends": [], "subdir": "linux-64"}
    paths = {"paths_version": 1, "paths": [{"_path": SO, "path_type": "hardlink", "size_in_bytes": len(payload)}]}
    path = dest / f"{stem}.conda"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        zf.writestr(f"pkg-{stem}.tar.zst", tar_zst({SO: payload}, threads))
        zf.writestr(f"info-{stem}.tar.zst", tar_zst({"info/index.json": json.dumps(index).encode(),
                                                     "info/paths.json": json.dumps(paths).encode(),
                                                     "info/files": SO.encode()}, threads))
    return path


def timed(package: Path, work: Path, threads: int | None, repeat: int) -> list[float]:
    record = AuditStamp(name="flash-attn", version="2.8.3", sass_archs=("sm_90",), verdict="pass")
    times = []
    for _ in range(repeat):
        copy = Path(shutil.copy(package, work / f"copy-{threads}.conda"))
        start = time.perf_counter()
        stamp_package(copy, record, threads=threads)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", type=Path, help="a large binary whose first --mib MiB are the payload")
    ap.add_argument("--mib", type=int, default=212)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--node", default="", help="the machine, in words (default: cores and memory)")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()
    source = args.payload or torch_target() / "torch" / "lib" / "libtorch_cuda.so"
    with source.open("rb") as fh:
        payload = fh.read(args.mib * 2**20)
    machine = detect()
    default_threads = min(MAX_ZSTD_THREADS, machine.cores)
    with tempfile.TemporaryDirectory(prefix="extforge-stampbench-") as tmp:
        package = make_package(Path(tmp), payload, default_threads)
        one = timed(package, Path(tmp), 1, args.repeat)
        default = timed(package, Path(tmp), None, args.repeat)
        size = package.stat().st_size
    result = {"payload": f"{source.name}[:{len(payload) / 2**20:.0f} MiB]", "package_mib": round(size / 2**20, 1),
              "one_thread_s": round(statistics.median(one), 2), "default_threads": default_threads,
              "default_s": round(statistics.median(default), 2)}
    print(json.dumps(result))
    if not args.no_record:
        node = args.node or f"{machine.cores} cores, {machine.memory_gib:.0f} GiB, {platform.machine()}"
        append_section([
            f"## Stamping a flash-attn-sized package ({dt.date.today().isoformat()})", "",
            f"Machine: {node}. `bench/stamp_bench.py`: `stamp_package` on a .conda laid out as rattler-build "
            f"writes one (zstd level {ZSTD_LEVEL}), its payload the first {len(payload) / 2**20:.0f} MiB of "
            f"{source.name} ({result['package_mib']} MiB packaged); median of {args.repeat} runs.", "",
            "| compression threads | seconds |", "|---:|---:|",
            f"| 1 (before) | {result['one_thread_s']} |",
            f"| {default_threads} (default: the cores, at most {MAX_ZSTD_THREADS}) | {result['default_s']} |",
        ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
