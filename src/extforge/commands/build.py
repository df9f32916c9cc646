"""`extforge build`: build a rattler-build v1 recipe against explicit channels."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "build a recipe with rattler-build against explicit channels (logs, variants, audit)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", type=Path, help="recipe folder (or its recipe.yaml)")
    parser.add_argument(
        "--channel",
        "-c",
        action="append",
        default=[],
        required=True,
        metavar="URL_OR_DIR",
        help="channel to solve from (repeatable, in priority order); never an implicit conda-forge",
    )
    parser.add_argument("--output-dir", "-o", type=Path, default=Path("output"), help="channel folder for the packages")
    parser.add_argument(
        "--variant-config", "-m", action="append", default=[], type=Path, metavar="FILE", help="variant file (repeatable)"
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="KEY=VALUE", help="override one variant key (repeatable)"
    )
    parser.add_argument("--profile", help="build profile for the resource planner (MAX_JOBS, NVCC_THREADS)")
    parser.add_argument("--no-test", action="store_true", help="skip the recipe's tests")
    parser.add_argument("--no-audit", action="store_true", help="skip the audit and stamp of built packages")
    from ..slurm.cli import add_build_options

    add_build_options(parser)


def run(args: argparse.Namespace) -> int:
    if args.slurm:
        from ..slurm.cli import submit_build

        return submit_build(args)
    from .. import ui
    from ..build import build_recipe, parse_variant_overrides

    overrides = parse_variant_overrides(args.variant)
    # Resolved now: the working directory may be replaced while the build runs.
    args.output_dir = args.output_dir.resolve()
    with ui.step(f"building {args.recipe}", quiet=args.json), ui.progress() as bar:
        task = bar.add_task("rattler-build", total=None)
        built = build_recipe(
            args.recipe,
            args.channel,
            args.output_dir,
            variant_config=args.variant_config,
            variants=overrides,
            profile=args.profile,
            test=not args.no_test,
            audit=not args.no_audit,
            on_step=lambda msg: bar.update(task, description=msg[:80]),
        )
    if args.json:
        ui.emit_json({"output_dir": str(args.output_dir.resolve()), "packages": [p.to_json() for p in built]})
    else:
        for p in built:
            ui.console.print(f"built {p.path}")
    return 0
