#!/usr/bin/env python3
"""How well `extforge build`'s running estimate of the time left holds: node builds' ninja logs
replayed as they stood at several moments, each fed to plan.build_progress (what the build
reports while it compiles), the predicted end set against the measured one.

  bench/progress_replay.py [--no-record]

The builds are full flash-attn builds (every head dim, sm_90) whose units started in the
planner's order: run Q's recipe build (32 cores, bench/data) and run P's (16 cores; its log holds
the first 32 units, its compiles ended 850 s after ninja started, from its `.jobs` samples).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _record import append_section

from extforge.machine import GIB, Machine
from extforge.planning import cost_store, plan

DATA = Path(__file__).resolve().parent / "data"
# (what, log, cores, memory GiB, compile end in ninja's seconds)
BUILDS = [
    ("run Q, 32 cores", DATA / "2026-11-26-h200x2-32cores-flash-attn-full-recipe.ninja_log", 32, 252, None),
    ("run P, 16 cores", DATA / "2026-11-26-h100-16cores-flash-attn-full-first32.ninja_log", 16, 126, 850.0),
]
FRACTIONS = (0.25, 0.5, 0.75)


def logged_lines(log_text: str) -> tuple[str, list[tuple[str, float]]]:
    """A ninja log's header, and each unit's line with the second it ended (after ninja started)."""
    header, *lines = log_text.splitlines()
    return header, [(line, int(line.split("\t")[1]) / 1000) for line in lines if line.count("\t") >= 4]


def replay(header: str, edges: list[tuple[str, float]], machine: Machine, at: float) -> plan.BuildProgress | None:
    """What the build reported `at` seconds after ninja started."""
    done = [(line, t) for line, t in edges if t <= at]
    text = "\n".join([header, *(line for line, _ in done)]) + "\n"
    age = at - max((t for _, t in done), default=0.0)
    return plan.build_progress(machine, "flash-attn", ["90"], text, age)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()
    link = plan.numbers_for("flash-attn").profile.link_seconds
    rows = ["| build | at (s after ninja started) | units done | speed | predicted end s | measured end s | error |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for what, log, cores, gib, known_end in BUILDS:
        header, edges = logged_lines(log.read_text())
        last_logged = max(t for _, t in edges)
        end = known_end or last_logged
        machine = Machine(cores=cores, memory_bytes=gib * GIB, glibc=None, cores_source="replay", memory_source="replay")
        for fraction in FRACTIONS:
            at = fraction * end
            if at > last_logged:
                continue  # past what the partial log holds
            progress = replay(header, edges, machine, at)
            if progress is None or progress.remaining_seconds is None or progress.node_speed is None:
                rows.append(f"| {what} | {at:.0f} | {progress.done if progress else 0} | - | - | {end + link:.0f} | - |")
                continue
            predicted = at + progress.remaining_seconds
            # The estimate runs to the end of compile + the profile's link; so does the measured end here.
            rows.append(f"| {what} | {at:.0f} | {progress.done} | {progress.node_speed:.3f} | {predicted:.0f} | "
                        f"{end + link:.0f} | {100 * (predicted - end - link) / (end + link):+.1f}% |")
    print("\n".join(rows))
    if not args.no_record:
        append_section([f"## The running build's estimate of the time left, replayed ({dt.date.today()})", "",
                        "`bench/progress_replay.py` on the development machine: node builds' ninja logs as they "
                        "stood a quarter, half and three quarters into their compiles, fed to what `extforge build` "
                        f"reports while it compiles (plan.build_progress); ends include the profile's {link:.0f} s "
                        "link estimate.", "", *rows])
    return 0


if __name__ == "__main__":
    with cost_store.recipe_costs(Path(__file__).resolve().parent.parent / "recipe" / "flash-attn"):
        raise SystemExit(main())
