"""extforge audit: prove a binary matches its target environment before it is published."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ExtforgeError
from ..options import option_type

HELP = "audit a package, wheel, prefix or .so: symbols, C++ ABI, GPU archs, glibc floor, packaging"


def _policy(validator: str) -> Callable[[str], Any]:
    """One of audit.policy's validators, imported only when the option is given (the audit
    package is heavy for `extforge audit --help`)."""
    def parse(text: str) -> Any:
        from ..audit import policy

        return getattr(policy, validator)(text)

    parse.__name__ = validator
    return parse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, metavar="TARGET", help=".conda/.tar.bz2 package, wheel, prefix or .so")
    parser.add_argument("--against", type=Path, metavar="PREFIX",
                        help="the environment it must run in (a prefix, a site-packages dir or a torch/lib dir)")
    parser.add_argument("--channel", metavar="URL",
                        help="without --against: install the package's pinned pytorch from this channel")
    parser.add_argument("--archs", type=option_type(_policy("parse_archs")), metavar="LIST", help="GPU archs the build promised, e.g. sm_80,sm_90")
    parser.add_argument("--glibc", type=option_type(_policy("parse_glibc")), metavar="VERSION", help="oldest glibc of the nodes, e.g. 2.28")
    parser.epilog = "exit code: 0 no errors, 1 errors found, 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..audit import audit_target
    from ..errors import EXIT_FINDINGS, EXIT_OK
    from ..ui import console, emit_json, step

    if args.against is not None and not args.against.exists():
        raise ExtforgeError(f"--against {args.against} does not exist", "",
                            "pass the environment's prefix, its site-packages folder or its torch/lib folder")
    if args.channel and not args.target.name.endswith((".conda", ".tar.bz2")):
        raise ExtforgeError(
            f"--channel does not apply to {args.target.name}",
            "the channel is where a package's pinned pytorch is installed from; a wheel, a prefix or a .so pins none",
            "pass --against with the environment it must run in",
        )
    with step(f"auditing {args.target.name}", quiet=args.json or not args.verbose):
        report = audit_target(args.target, against=args.against, archs=args.archs, glibc=args.glibc,
                              channel=args.channel)
    if args.json:
        emit_json(report.to_json())
    else:
        console.print(report.render(verbose=args.verbose > 0), soft_wrap=True)
    return EXIT_OK if report.ok else EXIT_FINDINGS
