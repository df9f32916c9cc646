#!/usr/bin/env python3
"""What the mirror downloads for one torch on several Pythons, truly cold: empty extforge and pip
caches (a temporary folder each), one `pip download` request per Python in the order given.
Prints per Python its seconds, the bytes the machine received meanwhile, and the wheels lent
from an earlier Python's download (any-python wheels: torch's nvidia-*). Appends a dated section
to docs/benchmarks-history.md unless --no-record.

    bench/shared_download_bench.py torch==2.9.1 --python $(pyenv root)/versions/3.10.*/bin/python3.10 \
        --python $(pyenv root)/versions/3.12.*/bin/python3.12
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import record_table, show

from extforge import mirror
from extforge.mirror.inputs import pip_wheel_dir


def received() -> int:
    """Bytes every network interface of this machine received so far."""
    return sum(int(p.read_text()) for p in Path("/sys/class/net").glob("*/statistics/rx_bytes"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("torch", help="the torch requirement, e.g. torch==2.9.1")
    ap.add_argument("--python", action="append", required=True, help="a CPython, in download order")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    requirements = mirror.pip_requirements(args.torch, [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="download-bench-") as tmp:
        os.environ["EXTFORGE_CACHE"] = str(Path(tmp) / "extforge")
        os.environ["PIP_CACHE_DIR"] = str(Path(tmp) / "pip")
        folders: list[Path] = []
        for python in args.python:
            before, start = received(), time.monotonic()
            inputs = mirror.from_pip(requirements, python)
            seconds, got = time.monotonic() - start, received() - before
            short = inputs.interpreter.short
            folder = pip_wheel_dir(requirements, short)
            wheels = list(folder.glob("*.whl"))
            lent = [w for w in wheels if any((f / w.name).exists() and (f / w.name).stat().st_ino == w.stat().st_ino
                                             for f in folders)]
            row = (f"| {short} | {seconds:.1f} s | {got / 1e9:.2f} GB | {len(wheels)} wheels, "
                   f"{sum(w.stat().st_size for w in wheels) / 1e9:.2f} GB | {len(lent)} wheels, "
                   f"{sum(w.stat().st_size for w in lent) / 1e9:.2f} GB | {len(inputs.artifacts)} |")
            show(rows, row)
            folders.append(folder)
    if not args.no_record:
        record_table("One torch downloaded for several Pythons", "shared_download_bench.py",
                     f"`{args.torch}`, truly cold (empty extforge and pip caches); \"received\": every byte the "
                     "machine's network took meanwhile.",
                     ["python", "request", "received", "its wheels", "lent from an earlier python", "artifacts"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
