"""`extforge status OUTPUT_DIR`: per-variant state of a `build --slurm` from Slurm and the channel."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError

HELP = "show the state of each variant of an `extforge build --slurm` (queued, running, failed, published)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", type=Path, help="the --output-dir given to `extforge build --slurm`")
    parser.add_argument("--variant", action="append", default=[], metavar="ID", help="only these variants (ids as listed)")


def run(args: argparse.Namespace) -> int:
    from ..slurm.report import print_rows, status_rows
    from ..slurm.state import collect, load_state
    from ..ui import emit_json

    # Accept the build's output dir or its slurm/ folder.
    roots = [args.output_dir / "slurm", args.output_dir]
    state = next((s for s in (load_state(r) for r in roots) if s is not None), None)
    if state is None:
        raise ExtforgeError(
            f"no Slurm build recorded under {args.output_dir}",
            "there is no slurm/state.json in it",
            "pass the --output-dir of an `extforge build --slurm` run",
        )
    unknown = sorted(set(args.variant) - set(state.jobs))
    if unknown:
        raise ExtforgeError(f"unknown variant(s): {', '.join(unknown)}", f"known: {', '.join(sorted(state.jobs))}", "pick ids from `extforge status`")
    rows = status_rows(collect(state, args.variant or None))
    if args.json:
        emit_json({"recipe": state.recipe, "channel": state.channel, "variants": rows})
    else:
        print_rows(rows)
    return EXIT_FINDINGS if any(r["state"] in {"failed", "lost"} for r in rows) else EXIT_OK
