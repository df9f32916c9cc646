"""`extforge plan`: MAX_JOBS / NVCC_THREADS that fit this machine (or a named node) and a Slurm request."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path

from ..errors import EXIT_OK, ExtforgeError
from ..fatbin import parse_arch_list
from ..machine import parse_memory
from ..options import option_type, positive_float, positive_int, positive_size
from ..ui import console, emit_json

HELP = "choose MAX_JOBS/NVCC_THREADS that cannot OOM, predict the build time, print a Slurm request"


def parse_archs(text: str) -> tuple[str, ...]:
    """'80,90', 'sm_80;9.0', '9.0+PTX' -> ('80', '90'): the archs a build compiles for, as the planner counts them."""
    return tuple(dict.fromkeys(a.code for a in parse_arch_list(text)))


def recipe_name(recipe: Path) -> str:
    """The name `extforge build` plans a recipe under: its package name (else its folder's)."""
    from ..engine import find_recipe
    from ..planning.cost_store import recipe_name as package_name

    recipe_file = find_recipe(recipe)
    return package_name(recipe_file.read_text()) or recipe_file.parent.name


def recipe_facts(recipe: Path) -> tuple[str | None, tuple[str, ...], int | None]:
    """A recipe folder's version, GPU archs (its variant files) and translation units (its sdist's
    setup.py, where the source cache, $EXTFORGE_SOURCES or the default, holds the sdist)."""
    from .. import engine
    from ..planning import cost_store
    from ..recipes import scaffold, sources, variants

    recipe_file = engine.find_recipe(recipe)
    archs = tuple(variants.archs(engine.read_variant_files(variants.recipe_files(recipe_file, []))[0]))
    units = None
    with contextlib.suppress(ExtforgeError):
        spec = sources.read_spec(recipe_file)
        sdist = sources.stored_path(spec, sources.build_root())
        if spec.is_sdist and sdist.is_file():
            units = scaffold.sdist_units(sdist)
    return cost_store.recipe_version(recipe_file.read_text()), archs, units


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", type=Path,
                        help="a recipe folder: plan for it by its folder name and version, its variants.yaml's archs and "
                        "the units its sdist's setup.py lists (when the source cache holds the sdist)")
    parser.add_argument("--cores", type=option_type(positive_int), help="plan for this many cores instead of this machine's")
    parser.add_argument("--memory", type=option_type(positive_size(parse_memory)), help="plan for this much memory, e.g. 128G")
    parser.add_argument("--profile", default=None,
                        help="the name the cost store knows the recipe by ($EXTFORGE_COST_STORE, default <cache root>/unit-costs; "
                        "default: the recipe's package name); without measured costs, a conservative estimate")
    parser.add_argument("--version", default=None, help="the recipe's version in the cost store (default: the newest measured)")
    parser.add_argument("--archs", type=option_type(parse_archs), default=None,
                        help="GPU archs, e.g. 80,90 or sm_80,sm_90 or 8.0;9.0 (default: the variant's cuda_archs, the "
                        "recipe's variants.yaml, else 80,90)")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                        help="plan this variant, as `extforge build --variant` builds it (repeatable): a subset's units "
                        "where the recipe's cost data says which it builds (e.g. flash_attn_head_dims=128)")
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--node-speed", type=option_type(positive_float), default=1.0,
                       help="this node type's compile seconds per second of the cost data (e.g. 0.7), from one "
                            "build on it (`extforge build` prints it at its end; --node-speed-from reads it from a log)")
    speed.add_argument("--node-speed-from", type=Path, metavar="NINJA_LOG",
                       help="plan at the speed this node type showed in a build's ninja log (the build keeps it "
                            "beside its build log: OUTPUT/logs/NAME-DATE.ninja_log), read against the same cost data")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("FIRST_LOG", "SECOND_LOG"),
                        help="the planner's error on a learned recipe: the second build's compile span predicted from "
                             "what the first build's ninja log teaches the planner (as `extforge build` stores it; the "
                             "site's store is not written), against the span its log measured")
    parser.add_argument("--nvcc-threads", type=option_type(positive_int), default=1,
                        help="the NVCC_THREADS of the build whose log --node-speed-from or --compare (the first) reads")
    parser.add_argument("--second-archs", type=option_type(parse_archs), default=None,
                        help="--compare: the second build's archs (default: the first's, --archs)")
    parser.add_argument("--second-nvcc-threads", type=option_type(positive_int), default=None,
                        help="--compare: the second build's NVCC_THREADS (default: the first's, --nvcc-threads)")


def run(args: argparse.Namespace) -> int:
    from .. import engine
    from ..machine import detect
    from ..planning import cost_store
    from ..planning.plan import DEFAULT_ARCHS, minutes, plan_build, slurm_request
    from ..recipes.variants import archs as variant_archs
    from ..recipes.variants import normal_archs, parse_variant_overrides

    machine = detect()
    if args.cores:
        machine = dataclasses.replace(machine, cores=args.cores, cores_source="--cores")
    if args.memory:
        machine = dataclasses.replace(machine, memory_bytes=args.memory, memory_source="--memory")
    variant = normal_archs(parse_variant_overrides(args.variant), "--variant")
    version, archs, units = recipe_facts(args.recipe) if args.recipe else (None, (), None)
    archs = args.archs or tuple(variant_archs(variant)) or archs or DEFAULT_ARCHS
    if args.compare:
        return compare(args, archs)
    if not (args.recipe or args.profile):
        raise ExtforgeError("no recipe to plan for", "the plan is made from the recipe's measured unit costs",
                            "name a recipe folder (extforge plan recipe/NAME), or the name its costs are stored "
                            "under (--profile NAME)")
    profile = args.profile or recipe_name(args.recipe)
    with cost_store.recipe_costs(engine.find_recipe(args.recipe).parent) if args.recipe else contextlib.nullcontext():
        speed = node_speed_from(args.node_speed_from, profile, archs, args.nvcc_threads) if args.node_speed_from \
            else args.node_speed
        plan = plan_build(machine, profile, archs, speed,
                          version=args.version or version, units=units, variant=variant)
    slurm = slurm_request(plan)
    if args.json:
        emit_json({"plan": dataclasses.asdict(plan), "env": plan.env(), "node_speed": speed,
                   "slurm": dataclasses.asdict(slurm) | {"sbatch_args": slurm.sbatch_args()}})
        return EXIT_OK
    if args.node_speed_from:
        console.print(f"node speed from {args.node_speed_from}: {speed} (this node type's compile seconds per second "
                      "of the cost data)", markup=False)
    gib = 1024**3
    spread = (f" ({minutes(plan.wall_range_seconds[0])} to {minutes(plan.wall_range_seconds[1])} on the nodes "
              "measured so far)" if plan.wall_range_seconds else "")
    console.print(
        f"{plan.profile} for sm_{', sm_'.join(plan.archs)} on {plan.cores} cores:\n"
        f"  numbers: {plan.numbers_from}\n"
        f"  {' '.join(f'{k}={v}' for k, v in plan.env().items() if k != 'EXTFORGE_UNIT_ORDER')}\n"
        f"  predicted peak {plan.predicted_peak_bytes / gib:.1f} GiB of {plan.memory_limit_bytes / gib:.1f} GiB allowed\n"
        f"  expected wall time ~{minutes(plan.expected_wall_seconds)} (compile + link)"
        + (f", longest units first{f', {len(plan.shard_units)} sharded in two' if plan.shard_units else ''}"
           f"{''.join(f', {u} in {k} parts' for u, k in plan.split_units)}{spread}; "
           f"in upstream's order ~{minutes(plan.upstream_order_wall_seconds)}\n"
           if plan.upstream_order_wall_seconds else "\n") +
        f"  sbatch {' '.join(slurm.sbatch_args())}",
        markup=False,
    )
    if args.verbose:
        for reason in plan.reasons:
            console.print(f"  - {reason}", markup=False)
    return EXIT_OK


# As much as `extforge build` keeps beside its build log (build.keep_beside_log); a ninja log of a
# few hundred units is well under a megabyte.
LOG_LIMIT = 64 * 2**20


def read_log(path: Path) -> str:
    """A build's ninja log (or the split log beside it), bounded: it may lie in a shared output folder."""
    from .. import shared_read

    try:
        return shared_read.read_text(path, limit=LOG_LIMIT)
    except shared_read.Refused:
        raise
    except OSError as exc:
        raise ExtforgeError(f"cannot read {path}", exc.strerror or str(exc),
                            "pass the .ninja_log a build kept beside its build log (OUTPUT/logs/NAME-DATE.ninja_log)") from None


def split_log(ninja_log: Path) -> str:
    """The build layer's split log that `extforge build` keeps beside a ninja log, or ''."""
    beside = ninja_log.with_name(ninja_log.name.removesuffix(".ninja_log") + ".split.log")
    return read_log(beside) if beside.is_file() else ""


def node_speed_from(log: Path, profile: str, archs: tuple[str, ...], threads: int) -> float:
    """This node type's speed against `profile`'s costs, from the ninja log of a build on it."""
    from ..planning import cost_store
    from ..planning.plan import build_node_speed, numbers_for

    speed = build_node_speed(profile, read_log(log), archs, threads, split=cost_store.read_split_log(split_log(log)).parts)
    if speed is None:
        numbers = numbers_for(profile)
        why = (f"the planner has no per-unit costs for {profile}: {numbers.source}" if numbers.costs is None
               else f"the log names none of {profile}'s units")
        raise ExtforgeError(f"cannot read a node speed from {log}", why,
                            "pass the ninja log of a build of the recipe you plan (RECIPE or --profile)")
    return speed


def compare(args: argparse.Namespace, archs: tuple[str, ...]) -> int:
    """`--compare FIRST SECOND`: the planner's error on the second build, predicted from the first."""
    from ..planning.plan import predict_second_build

    first, second = args.compare
    result = predict_second_build(read_log(first), read_log(second), archs, args.nvcc_threads,
                                  args.second_archs or archs, args.second_nvcc_threads or args.nvcc_threads,
                                  split_log(first), split_log(second))
    if args.json:
        emit_json(dataclasses.asdict(result) | {"first": str(first), "second": str(second), "error": result.error})
        return EXIT_OK
    first_line, second_line, *rest = result.lines()
    console.print("\n".join([f"{first_line} ({first})", f"{second_line} ({second})", *rest]), markup=False)
    return EXIT_OK
