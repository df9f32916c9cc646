"""`extforge build`: build a rattler-build v1 recipe against explicit channels."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..building.build_options import BuildOptions
from ..building.parts import parse_link_parts, parse_part
from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..options import manylinux_policy, option_type

if TYPE_CHECKING:
    from ..building.build import BuiltPackage

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
    parser.add_argument("--output-dir", "-o", type=Path, default=Path("output"), help="channel folder the audited packages, logs and wheels go to (the build solves from it only when -c names it too)")
    parser.add_argument(
        "--variant-config", "-m", action="append", default=[], type=Path, metavar="FILE",
        help="variant file (repeatable, later files win); given, it REPLACES the recipe's own variants.yaml "
        "(rattler-build's rule): pass that file too (-m RECIPE/variants.yaml -m FILE) to add to it",
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="KEY=VALUE",
        help="narrow one variant key (repeatable); a value the channel has no package for is refused before building",
    )
    parser.add_argument("--profile", help="build profile for the resource planner (MAX_JOBS, NVCC_THREADS)")
    parser.add_argument("--no-test", action="store_true", help="skip the recipe's tests")
    parser.add_argument("--no-audit", action="store_true", help="skip the audit and stamp of built packages")
    parser.add_argument(
        "--wheel", action="store_true",
        help="also write each audited package's wheel (the same compiled files, manylinux-tagged, torch==X.Y.Z pinned) "
        "into OUTPUT_DIR/wheels; `extforge publish --wheels` derives the same bytes from the .conda",
    )
    parser.add_argument("--manylinux", type=option_type(manylinux_policy), metavar="2_N",
                        help="with --wheel: the site's target policy; a package whose binaries need more gets no wheel (exit 1)")
    split = parser.add_argument_group(
        "a build in parts: N jobs compile a share of the units each into the compile cache (one EXTFORGE_CACHE "
        "on shared storage), then a link job builds the package from it (for a build one job cannot hold)")
    one = split.add_mutually_exclusive_group()
    one.add_argument("--part", type=option_type(parse_part), metavar="I/N",
                     help="compile part I of N into the compile cache and stop (no package)")
    one.add_argument("--link-parts", type=option_type(parse_link_parts), metavar="N",
                     help="the link job after N parts: build the package, every unit from the compile cache")
    from ..slurm.options import add_build_options

    add_build_options(parser)


def options_from_args(args: argparse.Namespace) -> BuildOptions:
    """The one BuildOptions of this command line, for the local and the Slurm path alike."""
    from ..recipes.variants import parse_variant_overrides

    return BuildOptions.make(
        args.recipe,
        args.channel,
        args.output_dir,
        variant_configs=args.variant_config,
        variants=parse_variant_overrides(args.variant),
        profile=args.profile,
        test=not args.no_test,
        audit=not args.no_audit,
        part=args.part or args.link_parts,
        wheel=args.wheel,
        manylinux=args.manylinux,
    )


def built_line(pkg: BuiltPackage) -> str:
    """The console line of one built package: its path and its audit verdict."""
    verdict = {None: "not audited (--no-audit)", "pass": "audit pass (stamped into the package)"}.get(
        pkg.audit_verdict, f"audit {pkg.audit_verdict}, kept aside (not in the output channel): "
        f"run `extforge audit {shlex.quote(str(pkg.path))}` for details")
    speed = ("" if pkg.node_speed is None else f"\n  this machine compiled at {pkg.node_speed:.2f}x the planner's unit costs: "
             f"plan the next build here with `extforge plan --node-speed {pkg.node_speed}`")
    wheel = (f"\n  wheel {pkg.wheel}" if pkg.wheel else
             f"\n  no wheel: {pkg.wheel_refused}" if pkg.wheel_refused else "")
    return f"built {pkg.path}; {verdict}{wheel}{speed}"


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    if args.wheels and not args.slurm:
        raise ExtforgeError("--wheels DIR is the wheel index the Slurm jobs publish to", "a local build publishes nothing",
                            "build with --wheel (the wheels go to OUTPUT_DIR/wheels) and publish with "
                            "`extforge publish PKG --wheels DIR`, or add --slurm --publish-to CHANNEL")
    if args.slurm:
        from ..slurm.cli import submit_build

        return submit_build(opts, args)
    from .. import ui
    from ..building.build import build_recipe

    with ui.step(f"building {args.recipe}", quiet=args.json), ui.LiveLine("rattler-build", quiet=args.json) as live:
        notes: list[str] = []
        built = build_recipe(opts, on_step=lambda msg: live.show(msg, key=msg), notes=notes,
                             on_progress=lambda p: live.show(p.describe(), key=p.run))
    if args.json:
        ui.emit_json({"output_dir": str(args.output_dir.resolve()), "packages": [p.to_json() for p in built], "split": notes})
    else:
        for line in notes:
            ui.console.print(line, markup=False)
        for p in built:
            ui.console.print(built_line(p), markup=False)
    return build_exit_code(built)


def build_exit_code(built: list[BuiltPackage]) -> int:
    """A package that fails its audit is built but must not be published, and a wheel asked for
    and refused is missing: a script or CI job that only reads the exit code has to stop there too."""
    return EXIT_FINDINGS if any(p.audit_verdict not in (None, "pass") or p.wheel_refused for p in built) else EXIT_OK
