#!/usr/bin/env python3
"""Whether every `extforge explain` signature matches in linear time on one long line without
whitespace: each pattern searched over 20 KB and 160 KB of a repeated unit, the growth printed
with a verdict. 8x the input is ~8x the time when linear, ~64x when quadratic (`\\S+\\.so` tried
from every position took 66 s on 160 KB before it was fixed). A verdict of speed, so a bench
and not a test: exit 3 when a unit grew more than LINEAR_LIMIT times.

    python bench/explain_patterns_bench.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from extforge.doctor.explain import load_signatures

# Repeated units that made a backtracking pattern quadratic on one line without whitespace.
UNITS = ["a", "a.so", ".so", "/", ":", ":1", "(1", "x(1):", "a.so.1", "a:1:1", "=", "FAILED: "]
# Linear is ~8x; quadratic ~64x. Below half a second a measurement is mostly noise.
LINEAR_LIMIT = 30
NOISE_SECONDS = 0.5


def search_seconds(text: str) -> float:
    start = time.monotonic()
    for sig in load_signatures():
        for p in (*sig.patterns, *sig.extract):
            p.search(text)
    return time.monotonic() - start


def linear(small: float, big: float) -> bool:
    return big < max(LINEAR_LIMIT * small, NOISE_SECONDS)


def main() -> int:
    worst = True
    print("| unit | 20 KB s | 160 KB s | growth | verdict |\n|---|---:|---:|---:|---|")
    for unit in UNITS:
        small = search_seconds(unit * (20_000 // len(unit)))
        big = search_seconds(unit * (160_000 // len(unit)))
        ok = linear(small, big)
        worst &= ok
        print(f"| {unit!r} | {small:.3f} | {big:.3f} | {big / small if small else float('inf'):.1f}x | "
              f"{'linear' if ok else 'NOT linear'} |")
    print(f"\nexplain signatures: {'linear on every unit' if worst else 'NOT linear on some unit (see above)'}")
    return 0 if worst else 3


if __name__ == "__main__":
    sys.exit(main())
