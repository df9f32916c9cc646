#!/usr/bin/env python3
"""How long `extforge install` of a locked environment takes, per phase, into fresh prefixes.

The first install runs as this user's first of these packages would (their archive checks
forgotten: `<cache>/trust-<uid>/checked/`), the others as every later install does: the
packages' archives in the store, extracted in the package cache, checked before. Each prints
its seconds, its phases (fetch and verify of the archives, link and check of the files, byte
code) and how many archives were decompressed to check their member paths. Appends a dated
section to docs/benchmarks-history.md unless --no-record.

    bench/install_bench.py pixi.lock ENV [--channel-map NAME=URL] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import record_table, show

from extforge.channel.install import install_env
from extforge.channel.mirrors import parse_channel_map
from extforge.channel.packages import locked_records, record_sha256
from extforge.channel.trust import trust_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=Path)
    ap.add_argument("env")
    ap.add_argument("--channel-map", action="append", default=[])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    mirrors = parse_channel_map(args.channel_map, args.lock.parent, "--channel-map")
    records = locked_records(args.lock, args.env, "linux-64")
    for r in records:
        (trust_dir() / "checked" / f"{record_sha256(r)}.json").unlink(missing_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="install-bench-") as tmp:
        for i in range(args.runs):
            prefix = Path(tmp) / f"env-{i}"
            result = install_env(args.lock, args.env, prefix, mirrors=mirrors)
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(result.timings.items()))
            row = (f"| {i + 1} | {result.seconds:.1f} s | {phases} | {result.archives_checked} of {result.packages} |")
            show(rows, row)
            shutil.rmtree(prefix)
    if not args.no_record:
        record_table("`extforge install` into fresh prefixes", "install_bench.py",
                     f"lock {args.lock.name}, env {args.env} ({len(records)} packages); run 1 with this user's archive "
                     "checks forgotten.", ["run", "install", "phases", "archives checked"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
