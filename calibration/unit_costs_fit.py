#!/usr/bin/env python3
"""Fit flash-attn's per-unit compile costs and the concurrency slowdown from build logs, and say
what the planner then predicts for the builds measured on the node.

  calibration/unit_costs_fit.py [--log NINJA_LOG ...] [--reference 16] [--emit-costs FILE] [--no-record]

The first --log gives every unit's seconds; each further one shares units with it at another
number of compiles at once, which fits the slowdown per extra compile (unit_costs.Concurrency).
A `.jobs` file beside a log (seconds since the build started, nvcc processes on the machine)
counts compiles the log does not know (another build beside it). The default logs are the ones
in bench/data/ (see its README). --emit-costs FILE writes recipe/flash-attn/build-costs.json to
FILE with the fitted units, slowdown and node speeds (the rest as it is); the predictions go to
docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

# _record: how the bench scripts append their results to docs/benchmarks-history.md.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _record import append_section

from extforge.planning import cost_store, unit_costs
from extforge.planning.plan import numbers_for

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
RECIPE = Path(__file__).resolve().parents[1] / "recipe" / "flash-attn"
LOGS = [DATA / "2026-11-25-h100-32cores-flash-attn-full.ninja_log", DATA / "2026-11-23-h100-16cores-flash-attn-hd128.ninja_log"]
# The slowdown measured on one node (calibration/compile_concurrency.py): the same unit 32 and 16 at once.
SAME_NODE = DATA / "2026-11-26-h200x2-32cores-compile-concurrency.json"
# A build whose node speed is measured but whose units the costs leave out: they come from a node
# of another speed (16 compiles at once, yet faster than 13 on run J's node).
RUN_P = DATA / "2026-11-26-h100-16cores-flash-attn-full-first32.ninja_log"


def side_by_side(run: str, recipe_log: Path, where: str, recipe: tuple[float, int], plain: tuple[float, int],
                 plain_when: str, beside: str = "") -> list[tuple[int, str, float, bool, str, Path]]:
    """The MEASURED rows of one side by side on a node (docs/gpu-e2e/): the recipe's build, then
    upstream's setup.py with the same settings, each as (compile span, seconds in all). Both are
    predicted at the speed of the recipe's log; the plain build's log lies beside it."""
    return [(32, "longest first", recipe[0], False, f"run {run} {where}, 2026-11-26, `extforge build`, its compile span "
             f"({recipe[1]} s from start to audit end){beside}; out of sample", recipe_log),
            (32, "name", plain[0], False, f"run {run}'s plain build, upstream's `setup.py bdist_wheel` {plain_when}, its "
             f"compile span ({plain[1]} s in all); out of sample", recipe_log)]


def plain_log(log: Path) -> Path | None:
    """The plain build's log beside a side by side's recipe log; None for any other log."""
    return log.with_name(log.name.replace("-recipe.", "-plain.")) if "-recipe." in log.name else None


# Full builds measured on nodes, sm_90, every head dim: (jobs, which order, seconds, link included,
# what, the log whose node speed also scales a second prediction, or None).
MEASURED = [
    (32, "log", 958.0, False, "the 32-core build of 2026-11-25 in bench/data, its compile span (1101 s from start to "
     "package); in-sample: the unit costs are this build's own log", None),
    (16, "name", 1407.0, True, "run G on a 16-core node, 2026-11-23, `setup.py build_ext` compile + link with the same "
     "compilers (setuptools compiles the sources in name order); out of sample: no unit cost comes from it", None),
    (16, "longest first", 850.0, False, "run P on a 16-core node, 2026-11-26, `extforge build`, its compile span (first "
     "to last nvcc; 946 s from start to package); out of sample", RUN_P),
    *side_by_side("Q", DATA / "2026-11-26-h200x2-32cores-flash-attn-full-recipe.ninja_log",
                  "on a 32-core node (two H200s)", (469.7, 558), (577.1, 595),
                  "on the same node right after the recipe (ninja starts its units in name order)"),
    *side_by_side("S", DATA / "2026-11-26-h200x4-halves-flash-attn-full-recipe.ninja_log",
                  "on 32 of a 64-core node's cores (four H200s)", (667.8, 700), (769.9, 786),
                  "on the other 32 cores at the same time", beside=", the plain build on the other 32 at the same time"),
    # Run Q's setting again on another node of that kind, with the recipe's fixed steps cut.
    *side_by_side("T", DATA / "2026-11-26-run-t-h200x2-32cores-flash-attn-full-recipe.ninja_log",
                  "on a 32-core node (two H200s)", (483.7, 520), (666.0, 684),
                  "on the same node right after the recipe"),
]


def load_samples(log: Path) -> list[tuple[float, float]]:
    """The `.jobs` file beside a log, as (seconds since its first nvcc, nvcc processes)."""
    jobs = log.with_suffix(".jobs")
    if not jobs.is_file():
        return []
    rows = [(float(t), float(n)) for t, n in (line.split() for line in jobs.read_text().splitlines() if line.strip())]
    first = next((t for t, n in rows if n > 0), 0.0)
    return [(t - first, n) for t, n in rows if t >= first]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, action="append", help="a ninja log (repeatable; default: bench/data's)")
    ap.add_argument("--reference", type=int, default=16, help="compiles at once the data's seconds are for")
    ap.add_argument("--emit-costs", type=Path, help="write flash-attn's build-costs.json, refitted, here")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    ap.add_argument("--across-nodes", action="store_true",
                    help="fit the slowdown from the logs (their nodes' speeds count as slowdown) instead of taking "
                         "the one measured on one node")
    args = ap.parse_args()
    logs = args.log or LOGS
    runs = [(unit_costs.parse_ninja_log(p.read_text()), load_samples(p)) for p in logs]
    across = unit_costs.fit_concurrency(runs, args.reference, measured=", ".join(p.name for p in logs))
    same = json.loads(SAME_NODE.read_text())
    concurrency = across if args.across_nodes else unit_costs.Concurrency(
        args.reference, same["per_compile"], f"{SAME_NODE.name}: {same['unit']} "
        + ", ".join(f"{n} at once {v['median_s']} s" for n, v in same["levels"].items()))
    edges, load = runs[0]
    seconds = unit_costs.at_reference(edges, concurrency, load)
    shipped = json.loads((RECIPE / cost_store.RECIPE_FILE).read_text())
    upstream = [u for u in shipped["units"] if u in seconds]  # setup.py's list, the data's order
    orders = {"name": sorted(seconds), "log": [e.unit for e in edges], "longest first": unit_costs.longest_first(seconds)}
    with cost_store.recipe_costs(RECIPE):
        link = numbers_for("flash-attn").profile.link_seconds

    speeds = {p: unit_costs.node_speed(unit_costs.parse_ninja_log(p.read_text()), seconds, concurrency, load_samples(p))
              for log in dict.fromkeys([*logs, *(m[5] for m in MEASURED if m[5])]) for p in (log, plain_log(log)) if p}
    # The concurrency bench's node, from its one unit at the reference's compiles at once.
    bench_speed = same["levels"][str(args.reference)]["median_s"] / seconds[same["unit"]]

    def predict(order: list[str], jobs: int, with_link: bool = True, speed: float = 1.0) -> float:
        return (unit_costs.list_schedule([(u, seconds[u] * speed) for u in order], jobs, concurrency).makespan
                + (link if with_link else 0))

    out = [f"slowdown per extra compile: {concurrency.per_compile:.4f} (a unit takes "
           f"{concurrency.factor(32) / concurrency.factor(16):.2f}x as long at 32 compiles at once as at 16), "
           f"from {concurrency.measured}",
           f"(fitted across the logs' nodes instead: {across.per_compile:.4f}, "
           f"{across.factor(32) / across.factor(16):.2f}x: the nodes' own speeds count in it)",
           f"sum of unit seconds at {args.reference} compiles at once: {sum(seconds.values()):.0f} "
           f"(the log's own: {sum(e.seconds for e in edges):.0f})",
           *(f"node speed of {p.name}: {speed:.3f} (median over {n} units; `extforge plan --node-speed`)"
             for p, (speed, n) in speeds.items()),
           f"node speed of {SAME_NODE.name}: {bench_speed:.3f} ({same['unit']} alone)", "",
           "| jobs | order | what | predicted s | measured s | error | measured build |", "|---:|---|---|---:|---:|---:|---|"]
    errors = []
    # Each build predicted at the data's speed, then (where a log measured its node) at that node's
    # speed: in-sample for the speed where the log is the build's own, out of sample for the rest.
    rows = [(jobs, order, measured, with_link, what, None) for jobs, order, measured, with_link, what, _ in MEASURED]
    rows += [(jobs, order, measured, with_link, f"{what.split(',')[0]}, at the node speed {log.name} measured", log)
             for jobs, order, measured, with_link, what, log in MEASURED if log]
    for jobs, order, measured, with_link, what, speed_log in rows:
        speed = speeds[speed_log][0] if speed_log else 1.0
        p = predict(orders[order], jobs, with_link, speed)
        scaled = f" x {speed:.3f}" if speed_log else ""
        out.append(f"| {jobs} | {order}{scaled} | compile{' + link' if with_link else ''} | {p:.0f} | {measured:.0f} | "
                   f"{100 * (p - measured) / measured:+.1f}% | {what} |")
        errors.append(f"planner error {jobs} cores: {100 * (p - measured) / measured:+.1f}% (full build, sm_90, {order} order"
                      f"{', node speed ' + format(speed, '.3f') if speed_log else ''}: {p:.0f} s predicted vs "
                      f"{measured:.0f} s measured, {what})")
    out += ["", *errors]
    print("\n".join(out))
    if args.emit_costs:
        shipped["units"] = {u: round(seconds[u], 1) for u in upstream}
        shipped["jobs"] = args.reference
        shipped["planner"] |= {"per_compile": concurrency.per_compile, "per_compile_measured": concurrency.measured,
                               "node_speeds": {p.name: round(speed, 3) for p, (speed, _) in speeds.items()}
                               | {SAME_NODE.name: round(bench_speed, 3)}}
        args.emit_costs.write_text(json.dumps(shipped, indent=1) + "\n")
    if not args.no_record:
        append_section([f"## Unit costs and the concurrency slowdown, fitted from build logs ({dt.date.today()})", "",
                        f"`calibration/unit_costs_fit.py` on {', '.join(p.name for p in logs)} (bench/data/README.md), "
                        "on the development machine (no build):", "", *out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
