#!/usr/bin/env python3
"""A recipe built twice through one empty compile cache, the second time in an output folder of
another depth and length (another admin's, another job's): the compile cache's hits and each
build's seconds. Both builds run `extforge build` (rattler-build), tests and audit included.

    bench/rebuild_elsewhere_bench.py CHANNEL [--recipe recipe/demo-ext]

The extforge cache (so the compile cache) is a temporary folder; rattler's package cache is the
user's. Appends a dated section to docs/benchmarks-history.md unless --no-record.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _record import record_table, show

from extforge import compile_cache

REPO = Path(__file__).resolve().parents[1]


def ccache_counters(cache_dir: Path) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, check=True,
                         env={**os.environ, "CCACHE_DIR": str(cache_dir)}).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines() if "\t" in line)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("channel", type=Path, help="the channel the recipe builds against (an extforge mirror)")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipe" / "demo-ext")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rebuild-bench-") as tmp:
        os.environ["EXTFORGE_CACHE"] = str(Path(tmp) / "extforge")
        for out in (Path(tmp) / "out", Path(tmp) / "admin-b" / "builds" / "a-longer-folder-name" / "out"):
            # This user's folder of the compile cache, as the build places it (per-user below a shared one).
            cache_dir = compile_cache.placement("ccache").path
            before, start = ccache_counters(cache_dir) if cache_dir.exists() else {}, time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "extforge", "build", str(args.recipe), "--channel",
                                   str(args.channel), "--output-dir", str(out)], capture_output=True, text=True)
            seconds = time.monotonic() - start
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return proc.returncode
            after = ccache_counters(compile_cache.placement("ccache").path)
            hits = sum(after.get(k, 0) - before.get(k, 0) for k in ("direct_cache_hit", "preprocessed_cache_hit"))
            misses = after.get("cache_miss", 0) - before.get("cache_miss", 0)
            row = f"| {out.relative_to(tmp)} | {len(str(out))} chars, depth {len(out.parts)} | {seconds:.1f} s | {hits} | {misses} |"
            show(rows, row)
    if not args.no_record:
        record_table("A rebuild in another output folder", "rebuild_elsewhere_bench.py",
                     f"`extforge build {args.recipe.name}` twice through one empty compile cache (ccache), the second "
                     "time in a deeper folder with a longer path.",
                     ["output folder", "path", "build", "cache hits", "misses"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
