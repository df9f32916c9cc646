"""`extforge mirror`: build the local upstream channel (conda-forge names, offline inputs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..mirror import CachedPackage, PackageJob

HELP = "build a local upstream channel (python, pytorch, compilers) from pip, wheels or an environment"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--channel", type=Path, required=True, help="channel folder to write (created)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--from-pip",
        action="store_true",
        help="pip download torch and its dependencies (the default)",
    )
    src.add_argument("--from-wheels", type=Path, metavar="DIR", help="a folder of wheels (torch and its dependencies)")
    src.add_argument(
        "--from-env",
        metavar="PYTHON",
        help="the python of an environment with torch installed (offline nodes): package it as is",
    )
    parser.add_argument(
        "--torch", default="torch", metavar="SPEC", help="with --from-pip: the torch requirement (default: torch)"
    )
    parser.add_argument(
        "--cuda-home",
        metavar="DIR",
        help="package the CUDA toolkit installed in DIR (e.g. /usr/local/cuda; offline nodes) instead of "
        "fetching one that matches torch (NVIDIA's wheels for 13.x, Debian's packages for 12.x)",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="with --from-pip or --from-wheels: the CPython to package as the channel's python and "
        "to pick wheels for (default: the one extforge runs on)",
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME",
        help="another distribution to repackage, with its dependencies (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from .. import mirror, ui
    from ..errors import ExtforgeError

    if args.from_env and args.python:
        raise ExtforgeError(
            "--python and --from-env both name the python to package",
            "--from-env packages the environment's own python",
            "drop --python, or use --from-pip/--from-wheels with --python",
        )
    python = args.python or sys.executable
    with ui.step("reading mirror inputs", quiet=args.json):
        if args.from_env:
            inputs = mirror.from_env(args.from_env)
        elif args.from_wheels:
            inputs = mirror.from_wheels(args.from_wheels, python)
        else:
            inputs = mirror.from_pip(mirror.pip_requirements(args.torch, args.extra), python)
    with ui.step(f"mirroring {inputs.description} into {args.channel}", quiet=args.json), ui.progress() as bar:
        task = bar.add_task("packages", total=None)

        def on_package(job: PackageJob, pkg: CachedPackage | None) -> None:
            if pkg is None:
                bar.update(task, description=f"{job.name} {job.version}")
            else:
                bar.advance(task)
                ui.log.info("%s %s %s (%s)", pkg.name, pkg.version, pkg.build, "cached" if pkg.cached else f"{pkg.seconds:.1f} s")

        result = mirror.build_mirror(args.channel, inputs, args.extra, cuda_home=args.cuda_home, on_package=on_package)
    if args.json:
        ui.emit_json(result.to_json())
    else:
        ui.console.print(
            f"channel {result.channel.resolve().as_uri()}: {len(result.packages)} packages "
            f"({sum(not p.cached for p in result.packages)} built, {sum(p.cached for p in result.packages)} cached), "
            f"variants in {result.variants_file}"
        )
    return 0
