"""extforge doctor: what on this machine and in this Python environment breaks CUDA extensions."""

from __future__ import annotations

import argparse

from ..errors import EXIT_FINDINGS, EXIT_OK

HELP = "probe this machine and a Python env (torch, nvcc, driver, GPUs, compiler ABI, installed CUDA extensions) and say what to fix"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="the interpreter of the environment to check (default: the one running extforge)",
    )
    parser.add_argument("--no-audit", action="store_true", help="skip auditing the installed CUDA extensions it knows (e.g. flash-attn)")
    parser.epilog = "exit code: 0 no errors (warnings may remain), 1 error findings, 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..doctor.diagnosis import run_doctor
    from ..doctor.render import render
    from ..ui import console, emit_json

    report = run_doctor(args.python, audit=not args.no_audit)
    if args.json:
        emit_json(report.to_json())
    else:
        console.print(render(report), markup=False, soft_wrap=True)
    return EXIT_FINDINGS if report.has_errors else EXIT_OK
