#!/usr/bin/env python3
"""flash-attn built plain (`setup.py bdist_wheel`) and through the recipe (`extforge build`),
same sdist, same MAX_JOBS / NVCC_THREADS / archs, each broken into phases, with per-unit times
read from ninja's own `.ninja_log`.

  bench/build_side_by_side.py SDIST --channel MIRROR [--python PY] [--jobs 16 --threads 1 --archs 90]
      [--head-dims 128] [--only plain|recipe] [--json-out run.json] [--merge a.json b.json]
      [--emit-costs costs.yaml]

With --head-dims both sides build the same head-dim subset: the plain side runs the recipe's
select_sources.py on the unpacked sdist with that subset alone (upstream's source order, no unit
split), the recipe side gets the variant flash_attn_head_dims and whatever the planner adds
(longest first, the longest units split in two).

Phases (seconds from the start of each build):
  env set-up  start → the first compile (recipe: solve, extract and link the build/host envs,
              the build script's set-up; plain: setup.py's own start-up)
  compile     ninja's first edge start → last edge end (.ninja_log)
  link        compile end → the line after the `-shared` link command
  package     link end → the package's tests (recipe) or the end (plain: the wheel)
  tests       rattler-build's test step (recipe)
  audit       extforge's audit of the built package (recipe)

Where both builds do not fit one node allocation, run `--only recipe --json-out recipe.json` and
`--only plain --json-out plain.json` one after the other and `--merge` them; the summed
per-unit compile seconds compare them with less noise than wall time. The table and the line
`recipe/plain wall ratio: X.XX (node, date)` are appended to docs/benchmarks-history.md unless
--no-record; --emit-costs writes recipe/flash-attn/build-costs.json with the build's per-unit
seconds (the cost store's entry format).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import append_section
from _sdist import unpack

from extforge.fatbin import parse_arch_list
from extforge.planning import cost_store, unit_costs
from extforge.planning.unit_costs import NinjaEdge, parse_ninja_log

RECIPE = Path(__file__).resolve().parent.parent / "recipe" / "flash-attn"
PHASES = ("env set-up", "compile", "link", "package", "tests", "audit")
# torch's BuildExtension writes build.ninja and starts ninja right after setuptools says it builds
# the extension (torch itself says "Emitting ninja build file" only when verbose).
NINJA_START = re.compile(r"Emitting ninja build file|building '[\w.]+' extension")
LINK_COMMAND = re.compile(r"\s-shared\s")
TESTS_START = re.compile(r"Collecting tests from")  # rattler-build's first line of the test step


@dataclass
class Side:
    """One build: its wall time, phases, per-unit seconds and where it ran."""

    side: str  # "plain" or "recipe"
    wall: float
    phases: dict[str, float]
    units: dict[str, float]
    node: str
    date: str
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def unit_seconds_sum(self) -> float:
        return sum(self.units.values())


def phases(wall: float, lines: Sequence[tuple[float, str]], edges: Sequence[NinjaEdge],
           marks: dict[str, float] | None = None) -> dict[str, float]:
    """Split a build of `wall` seconds into PHASES from its timestamped output lines, its ninja
    edges (ms from ninja's start) and explicit marks ("tests", "audit", "audit end": seconds).
    The ninja log's own clock starts when ninja starts, right after build.ninja is written."""
    marks = marks or {}
    ninja_t0 = next((t for t, line in lines if NINJA_START.search(line)), None)
    if ninja_t0 is None or not edges:
        raise ValueError("no ninja build in this log (no \"building '...' extension\" line or no .ninja_log edges)")
    compile_start = ninja_t0 + min(e.start_ms for e in edges) / 1000
    compile_end = ninja_t0 + max(e.end_ms for e in edges) / 1000
    link_cmd = next((i for i, (t, line) in enumerate(lines) if t >= compile_end and LINK_COMMAND.search(line)), None)
    link_end = lines[link_cmd + 1][0] if link_cmd is not None and link_cmd + 1 < len(lines) else compile_end
    tests_start = marks.get("tests", marks.get("audit", wall))
    audit_start = marks.get("audit", wall)
    out = {
        "env set-up": compile_start,
        "compile": compile_end - compile_start,
        "link": link_end - compile_end,
        "package": tests_start - link_end,
        "tests": audit_start - tests_start,
        "audit": marks.get("audit end", wall) - audit_start,
    }
    return {k: round(max(0.0, v), 1) for k, v in out.items()}


def _timestamped(stream: Iterable[str], t0: float, sink) -> list[tuple[float, str]]:
    lines = []
    for line in stream:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
        sink.write(line)
    return lines


def build_plain(sdist: Path, work: Path, python: str, env: dict[str, str], log,
                head_dims: str) -> tuple[float, list, list[NinjaEdge]]:
    src = unpack(sdist, work, python, head_dims=head_dims)
    t0 = time.monotonic()
    proc = subprocess.Popen([python, "setup.py", "bdist_wheel"], cwd=src, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _timestamped(proc.stdout, t0, log)
    if proc.wait():
        raise SystemExit(f"plain build failed (exit {proc.returncode}); log: {log.name}")
    wall = time.monotonic() - t0
    ninja_log = next(src.glob("build/temp*/.ninja_log"))
    return wall, lines, parse_ninja_log(ninja_log.read_text())


def build_recipe_side(sdist: Path, work: Path, recipe: Path, channel: Path, variants: list[str], env: dict[str, str],
                      output_dir: Path, variant_configs: list[Path]):
    """`extforge build` in this process, its log lines timestamped as rattler-build emits them;
    the ninja log is saved before the work folder is deleted, the audit is timed."""
    from extforge import engine
    from extforge.building import build as build_mod
    from extforge.building.build_options import BuildOptions
    from extforge.hashing import sha256_file
    from extforge.recipes.variants import parse_variant_overrides

    digest = sha256_file(sdist)
    store = work / "sources" / "sha256" / digest
    store.mkdir(parents=True)
    os.link(sdist, store / sdist.name) if sdist.stat().st_dev == store.stat().st_dev else shutil.copy2(sdist, store)
    os.environ.update(env | {"EXTFORGE_SOURCES": str(work / "sources")})
    t0 = time.monotonic()
    lines: list[tuple[float, str]] = []
    marks: dict[str, float] = {}
    saved: list[Path] = []
    on_log, after_build = engine.LogSink.on_log, build_mod.after_build

    def timed_on_log(self, event) -> None:
        lines.append((time.monotonic() - t0, str(event.message)))
        if "tests" not in marks and TESTS_START.search(str(event.message)):
            marks["tests"] = time.monotonic() - t0
        on_log(self, event)

    def timed_after_build(packages, channels, build_env=None) -> None:
        for log_file in (output_dir / "bld").glob("rattler-build_*/work/build/temp*/.ninja_log"):
            saved.append(Path(shutil.copy(log_file, work / "recipe.ninja_log")))
        marks["audit"] = time.monotonic() - t0
        after_build(packages, channels, build_env)
        marks["audit end"] = time.monotonic() - t0

    engine.LogSink.on_log, build_mod.after_build = timed_on_log, timed_after_build
    try:
        built = build_mod.build_recipe(BuildOptions.make(recipe, [channel], output_dir, variant_configs=variant_configs,
                                                         variants=parse_variant_overrides(variants)))
    finally:
        engine.LogSink.on_log, build_mod.after_build = on_log, after_build
    wall = time.monotonic() - t0
    for speed in {p.node_speed for p in built if p.node_speed}:
        print(f"this machine compiled at {speed}x the planner's unit costs (`extforge plan --node-speed {speed}`)",
              file=sys.stderr)
    if not saved:
        raise SystemExit("the recipe build left no .ninja_log (did setup.py build through ninja?)")
    return wall, lines, parse_ninja_log(saved[0].read_text()), marks


def write_timeline(json_out: Path | None, side: str, lines: Sequence[tuple[float, str]]) -> None:
    """Every output line with its second since the build started, beside --json-out: where a
    phase's seconds went (the env set-up's steps, say) is read from it after the node is gone."""
    if json_out:
        json_out.with_name(f"{json_out.stem}-{side}.timeline").write_text(
            "".join(f"{t:8.2f} {line}\n" for t, line in sorted(lines, key=lambda tl: tl[0])))


def table(sides: Sequence[Side]) -> list[str]:
    head = "| phase | " + " | ".join(f"{s.side} s" for s in sides) + " |"
    rows = [head, "|---|" + "---:|" * len(sides)]
    rows += [f"| {p} | " + " | ".join(f"{s.phases.get(p, 0.0):.1f}" for s in sides) + " |" for p in PHASES]
    rows.append("| **wall** | " + " | ".join(f"**{s.wall:.1f}**" for s in sides) + " |")
    rows.append("| units compiled | " + " | ".join(str(len(s.units)) for s in sides) + " |")
    rows.append("| summed per-unit compile s | " + " | ".join(f"{s.unit_seconds_sum:.0f}" for s in sides) + " |")
    return rows


def ratio_line(sides: Sequence[Side]) -> str | None:
    by = {s.side: s for s in sides}
    if {"plain", "recipe"} <= by.keys():
        r = by["recipe"]
        if r.settings.get("FLASH_ATTN_HEAD_DIMS"):
            return (f"recipe/plain wall ratio: {r.wall / by['plain'].wall:.2f} (head dims "
                    f"{r.settings['FLASH_ATTN_HEAD_DIMS']}, {r.node}, {r.date})")
        return f"full recipe/plain wall ratio: {r.wall / by['plain'].wall:.2f} (every head dim, {r.node}, {r.date})"
    return None


def longest_units(side: Side, n: int = 5) -> list[str]:
    return [f"{u} {side.units[u]:.0f} s" for u in unit_costs.longest_first(side.units)[:n]]


def load_sides(paths: Sequence[Path]) -> list[Side]:
    sides: list[Side] = []
    for p in paths:
        for d in json.loads(p.read_text()):
            sides = [s for s in sides if s.side != d["side"]] + [Side(**d)]
    return sorted(sides, key=lambda s: ("plain", "recipe").index(s.side))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path, nargs="?", help="flash_attn-X.Y.Z.tar.gz")
    ap.add_argument("--channel", type=Path, help="mirror channel for the recipe build")
    ap.add_argument("--recipe", type=Path, default=Path(__file__).resolve().parents[1] / "recipe" / "flash-attn")
    ap.add_argument("--python", default=sys.executable, help="python with torch for the plain build")
    ap.add_argument("--variant", action="append", default=[], help="recipe variant override KEY=VALUE")
    ap.add_argument("--jobs", default="16")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--archs", default="90", help="FLASH_ATTN_CUDA_ARCHS, ';'-separated")
    ap.add_argument("--head-dims", default="", help="build this head-dim subset on both sides, e.g. 128")
    ap.add_argument("--variant-config", "-m", type=Path, action="append", default=[], help="recipe variant file")
    ap.add_argument("--output-dir", type=Path, help="the recipe side's output channel (default: in the build folder)")
    ap.add_argument("--only", choices=("plain", "recipe"))
    ap.add_argument("--work", type=Path, help="where to build (default: a temp dir)")
    ap.add_argument("--json-out", type=Path, help="write this run's sides as JSON (for --merge)")
    ap.add_argument("--merge", type=Path, nargs="+", help="report these JSON files instead of building")
    ap.add_argument("--emit-costs", type=Path, help="write flash-attn's build-costs.json with this build's units here")
    ap.add_argument("--node", default="", help="the machine, in words (default: cores and memory)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()

    if args.merge:
        sides = load_sides(args.merge)
    else:
        if not args.sdist:
            ap.error("an sdist is needed unless --merge")
        from extforge.machine import detect

        m = detect()
        node = args.node or f"{m.cores} cores, {m.memory_gib:.0f} GiB"
        env = {"MAX_JOBS": args.jobs, "NVCC_THREADS": args.threads, "FLASH_ATTN_CUDA_ARCHS": args.archs,
               "FLASH_ATTENTION_FORCE_BUILD": "TRUE", **({"FLASH_ATTN_HEAD_DIMS": args.head_dims} if args.head_dims else {})}
        base = Path(tempfile.mkdtemp(prefix="side-by-side-", dir=args.work))
        sides = []
        today = dt.date.today().isoformat()
        sdist = args.sdist.resolve()
        if args.only in (None, "plain"):
            from extforge.mirror.toolchain import pick_compilers

            (base / "plain").mkdir()
            # The compilers the mirror gives the recipe (a g++ that links the shared libstdc++).
            cc, cxx = pick_compilers()
            with (base / "plain.log").open("w") as log:
                wall, lines, edges = build_plain(sdist, base / "plain", args.python, env | {"CC": cc, "CXX": cxx}, log,
                                                 args.head_dims)
            sides.append(Side("plain", round(wall, 1), phases(wall, lines, edges), unit_costs.unit_seconds(edges),
                              node, today, env))
            write_timeline(args.json_out, "plain", lines)
        if args.only in (None, "recipe"):
            if not args.channel:
                ap.error("--channel is needed for the recipe build")
            (base / "recipe").mkdir()
            variants = [f"cuda_archs={args.archs}", *args.variant,
                        *([f"flash_attn_head_dims={args.head_dims}"] if args.head_dims else [])]
            wall, lines, edges, marks = build_recipe_side(sdist, base / "recipe", args.recipe, args.channel, variants,
                                                          {k: v for k, v in env.items() if k in ("MAX_JOBS", "NVCC_THREADS")},
                                                          (args.output_dir or base / "recipe" / "out").absolute(),
                                                          args.variant_config)
            # The planner chooses the recipe's MAX_JOBS/NVCC_THREADS: record what the build script used.
            used = next((m.groups() for _, line in lines if (m := re.search(r"MAX_JOBS=(\d+) NVCC_THREADS=(\d+)", line))), None)
            if used and used != (args.jobs, args.threads):
                print(f"warning: the recipe built with MAX_JOBS={used[0]} NVCC_THREADS={used[1]}", file=sys.stderr)
            recipe_env = env | ({"MAX_JOBS": used[0], "NVCC_THREADS": used[1]} if used else {})
            sides.append(Side("recipe", round(wall, 1), phases(wall, lines, edges, marks), unit_costs.unit_seconds(edges),
                              node, today, recipe_env))
            write_timeline(args.json_out, "recipe", [*lines, *((t, f"== {m}") for m, t in marks.items())])
        print(f"build folders and logs: {base}", file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(s) for s in sides], indent=2))
    rows = table(sides)
    ratio = ratio_line(sides)
    print("\n".join(rows + ([ratio] if ratio else [])))
    if args.emit_costs:
        src = next(s for s in sides if s.side == "plain") if any(s.side == "plain" for s in sides) else sides[0]
        # recipe/flash-attn/build-costs.json with this build's units (a unit split in two counted
        # whole, by the recipe's own split model).
        entry = json.loads((RECIPE / cost_store.RECIPE_FILE).read_text())
        with cost_store.recipe_costs(RECIPE):
            shipped = cost_store.load("flash-attn")
        model = shipped.model if shipped else None
        archs = src.settings.get("TORCH_CUDA_ARCH_LIST") or src.settings.get("FLASH_ATTN_CUDA_ARCHS") or "9.0"
        entry |= {"measured_at": f"{src.date}T00:00:00+00:00", "host": re.sub(r"[^!-~]+", "-", src.node),
                  "archs": [a.code for a in parse_arch_list(archs)], "jobs": int(src.settings.get("MAX_JOBS") or 1),
                  "units": unit_costs.joined(src.units, model.shards if model else None)}
        entry["planner"]["measured"] = f"{src.node}, {src.date}, {src.side} build, MAX_JOBS={src.settings.get('MAX_JOBS')}"
        args.emit_costs.write_text(json.dumps(entry, indent=1) + "\n")
    if not args.no_record:
        s0 = sides[0]
        append_section([
            f"## flash-attn side by side: plain setup.py vs the recipe ({s0.date})\n",
            f"Node: {s0.node}. `bench/build_side_by_side.py`, MAX_JOBS={s0.settings.get('MAX_JOBS')}, "
            f"NVCC_THREADS={s0.settings.get('NVCC_THREADS')}, FLASH_ATTN_CUDA_ARCHS={s0.settings.get('FLASH_ATTN_CUDA_ARCHS')}"
            f"{', head dims ' + s0.settings['FLASH_ATTN_HEAD_DIMS'] if s0.settings.get('FLASH_ATTN_HEAD_DIMS') else ''}; "
            "compile and per-unit seconds from ninja's .ninja_log.\n",
            *rows, "",
            *[f"Longest units ({s.side}): {', '.join(longest_units(s))}." for s in sides],
            *([f"\n{ratio}"] if ratio else []),
        ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
