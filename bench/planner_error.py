#!/usr/bin/env python3
"""How well a recipe's first build predicts its second: the planner's error on a learned recipe.

  bench/planner_error.py FIRST_NINJA_LOG SECOND_NINJA_LOG [--recipe causal-conv1d] [--version 1.7.0]
                         [--archs 90] [--threads 1] [--second-archs 90] [--second-threads 1]

The first build's log goes through the cost store as `extforge build` stores it (a scratch store,
not the site's), the planner reads it back, and predicts the second build's compile span: its
units, at the number of compiles the second log ran at once, started in the order the second log
shows (a recipe that takes the planner's EXTFORGE_UNIT_ORDER starts them longest first; one that
does not, in setuptools' order), run by run where the build ran ninja once per extension.
The measured span is each ninja run's first start to last end, added up; the links after them
are in neither. Prints `planner error on second build: X%`
((predicted - measured) / measured).

A build whose layer compiled units as parallel parts keeps its split log beside the ninja log
(`<log>.split.log`): the first's teaches the store its units' whole cost, the second's says which
units were split and in how many parts; those parts are predicted as the planner models them,
each a compile beside those the log shows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from extforge import cost_store, unit_costs
from extforge.plan import numbers_for, unit_seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="the first build's .ninja_log (the one the store learns from)")
    ap.add_argument("second", type=Path, help="the second build's .ninja_log (the one predicted)")
    ap.add_argument("--recipe", default="learned-recipe")
    ap.add_argument("--version", default="0")
    ap.add_argument("--archs", default="90", help="the first build's archs, comma separated")
    ap.add_argument("--threads", type=int, default=1, help="the first build's NVCC_THREADS")
    ap.add_argument("--second-archs", default=None, help="the second build's archs (default: the first's)")
    ap.add_argument("--second-threads", type=int, default=None, help="the second build's NVCC_THREADS (default: the first's)")
    args = ap.parse_args()
    archs = tuple(a for a in args.archs.split(",") if a)
    second_archs = tuple(a for a in (args.second_archs or args.archs).split(",") if a)
    second_threads = args.second_threads or args.threads

    with tempfile.TemporaryDirectory() as store:
        os.environ[cost_store.STORE_ENV] = store
        learned = cost_store.save(cost_store.measure(args.recipe, args.version, args.first.read_text(), archs,
                                                     args.threads, None, split_log(args.first)))
        numbers = numbers_for(args.recipe, args.version)
    if numbers.costs is None:
        print("the store gave the planner no costs back", file=sys.stderr)
        return 1
    costs = unit_seconds(numbers.profile, numbers.costs, len(second_archs), second_threads)
    edges = unit_costs.parse_ninja_log(args.second.read_text())
    jobs = max(n for _, n in unit_costs.running_counts(edges))
    measured = unit_costs.compile_seconds(edges)
    unknown = [e.unit for e in edges if e.unit not in costs]
    if unknown:
        print(f"the second build compiled units the first did not: {', '.join(unknown)}", file=sys.stderr)
        return 1
    runs = unit_costs.ninja_runs(edges) or (tuple(e.unit for e in edges),)
    parts = cost_store.read_split_log(split_log(args.second)).parts
    seconds = {e.unit: costs[e.unit] for e in edges}
    for unit, k in parts.items():
        seconds, runs = unit_costs.with_parts(seconds, runs, unit, k)
    slots = jobs + sum(k - 1 for k in parts.values())
    predicted = unit_costs.runs_makespan(seconds, slots, runs=runs, upstream_order=True)
    longest_first = unit_costs.runs_makespan(seconds, slots, runs=runs)
    print(f"first build: {len(learned.units)} units, {learned.jobs} at once, compile span {learned.compile_seconds:.1f} s "
          f"({args.first})")
    print(f"second build: {len(edges)} units in {len(runs)} ninja run(s), {jobs} at once, compile span {measured:.1f} s "
          f"({args.second})")
    print(f"predicted from the first, in the second's start order: {predicted:.1f} s "
          f"(longest first: {longest_first:.1f} s)")
    if parts:
        print(f"second build's units in parallel parts: {', '.join(f'{u} in {k}' for u, k in parts.items())} "
              f"({slots} compiles at once)")
    print(f"planner error on second build: {100 * (predicted - measured) / measured:+.1f}%")
    return 0


def split_log(ninja_log: Path) -> str:
    """The build layer's split log kept beside a build's ninja log (`extforge build`), or ''."""
    beside = ninja_log.with_name(ninja_log.name.removesuffix(".ninja_log") + ".split.log")
    return beside.read_text() if beside.is_file() else ""


if __name__ == "__main__":
    sys.exit(main())
