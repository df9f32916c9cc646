#!/usr/bin/env python3
"""How long `extforge build` takes from its start to the first compile, with a warm package cache.

Runs build_recipe in this process (what `extforge build` runs) while a thread polls /proc for
the first compiler process (nvcc, cicc, cc1plus), and records when each rattler-build step
began. Everything before it is what a user waits for before any kernel compiles:
solving, extracting and linking the build/host environments into the work folder, the build
script's own set-up. Run it twice: the first run warms the package cache.

  bench/first_compile_bench.py --channel MIRROR [--recipe recipe/demo-ext] [--runs 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import append_section

from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.machine import detect

COMPILERS = (b"nvcc", b"cicc", b"cc1plus")


def compiler_running() -> bool:
    """Whether a compile runs: nvcc (or its cicc) for .cu units, cc1plus for the .cpp binding."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].rsplit(b"/", 1)[-1] in COMPILERS:
            return True
    return False


def one_build(recipe: Path, channel: Path, out: Path, test: bool) -> dict:
    t0 = time.monotonic()
    steps: list[tuple[float, str]] = []
    first_compile: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not first_compile:
            if compiler_running():
                first_compile.append(time.monotonic() - t0)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        build_recipe(BuildOptions.make(recipe, [channel], out, test=test),
                     on_step=lambda msg: steps.append((time.monotonic() - t0, msg)))
    finally:
        done.set()
        watcher.join()
    return {"wall": time.monotonic() - t0, "first_compile": first_compile[0] if first_compile else None, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channel", type=Path, required=True, help="the mirror channel the recipe builds against")
    ap.add_argument("--recipe", type=Path, default=Path(__file__).resolve().parents[1] / "recipe" / "demo-ext")
    ap.add_argument("--runs", type=int, default=2, help="builds in a row (the first warms the package cache)")
    ap.add_argument("--no-test", action="store_true", help="skip the package's own tests")
    ap.add_argument("--label", default="", help="what this run measures (for the table)")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()

    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="first-compile-") as tmp:
            r = one_build(args.recipe, args.channel, Path(tmp), test=not args.no_test)
        results.append(r)
        print(f"run {i + 1}: first compile at {r['first_compile']} s, wall {r['wall']:.1f} s", file=sys.stderr)
        for t, msg in r["steps"]:
            print(f"  {t:7.1f} s  {msg}", file=sys.stderr)
    rows = [f"| {i + 1} | {args.label} | {r['first_compile']:.1f} | {r['wall']:.1f} |" if r["first_compile"] is not None
            else f"| {i + 1} | {args.label} | no compile seen | {r['wall']:.1f} |" for i, r in enumerate(results)]
    print("\n".join(rows))
    if not args.no_record:
        m = detect()
        append_section([
            f"## Time to the first compile, {args.recipe.name} ({dt.date.today().isoformat()})\n",
            f"Machine: development machine, {m.cores} cores, {m.memory_gib:.0f} GiB; load average "
            f"{os.getloadavg()[0]:.1f} at the end. `bench/first_compile_bench.py --runs {args.runs}`: "
            "`extforge build` from its start to the first compile process (run 1 may fill the package cache).\n",
            "| run | variant | first compile s | wall s |", "|---|---|---:|---:|", *rows,
        ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
