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
                        help="the environment it must run in: a venv (pip's torch and its nvidia-* wheels), a conda prefix, "
                        "a site-packages dir or a torch/lib dir")
    parser.add_argument("-c", "--channel", metavar="URL", action="append",
                        help="without --against: install the package's pinned pytorch from this channel "
                        "(repeatable, in priority order)")
    parser.add_argument("--every-torch", action="store_true",
                        help="with --channel: audit the package against every torch build the channels hold and "
                        "check that its run requirements admit exactly torches it passes against (a stable-ABI "
                        "build such as flash-attn-3 serves several)")
    parser.add_argument("--archs", type=option_type(_policy("arch_names")), metavar="LIST", help="GPU archs the build promised, e.g. sm_80,sm_90 (or 8.0;9.0, 80,90)")
    parser.add_argument("--glibc", type=option_type(_policy("parse_glibc")), metavar="VERSION", help="oldest glibc of the nodes, e.g. 2.28")
    parser.epilog = "exit code: 0 no errors, 1 errors found, 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..audit import audit_target
    from ..errors import EXIT_FINDINGS, EXIT_OK
    from ..ui import console, emit_json, step

    if args.against is not None and not args.against.exists():
        raise ExtforgeError(f"--against {args.against} does not exist", "",
                            "pass the environment's venv or prefix, its site-packages folder or its torch/lib folder")
    if args.channel and not args.target.name.endswith((".conda", ".tar.bz2")):
        raise ExtforgeError(
            f"--channel does not apply to {args.target.name}",
            "the channel is where a package's pinned pytorch is installed from; a wheel, a prefix or a .so pins none",
            "pass --against with the environment it must run in",
        )
    if args.every_torch:
        return _every_torch(args)
    with step(f"auditing {args.target.name}", quiet=args.json or not args.verbose):
        report = audit_target(args.target, against=args.against, archs=args.archs, glibc=args.glibc,
                              channel=args.channel)
    if args.json:
        emit_json(report.to_json())
    else:
        console.print(report.render(verbose=args.verbose > 0), soft_wrap=True)
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _every_torch(args: argparse.Namespace) -> int:
    from ..audit import audit_every_torch
    from ..errors import EXIT_FINDINGS, EXIT_OK
    from ..ui import console, emit_json, step

    if not args.channel:
        raise ExtforgeError("--every-torch needs --channel", "the torch builds to audit against are those of a channel",
                            "pass --channel with the channel(s) your users install torch from")
    with step(f"auditing {args.target.name} against every torch of {', '.join(args.channel)}",
              quiet=args.json or not args.verbose):
        verdicts = audit_every_torch(args.target, args.channel, archs=args.archs, glibc=args.glibc)
    ok = all(v.ok for v in verdicts)
    if args.json:
        emit_json({"target": str(args.target), "ok": ok, "torches": [
            {"torch": v.torch, "admitted": v.refused is None, "refused": v.refused, "audit_ok": v.report.ok,
             "errors": [f.message for f in v.report.errors]} for v in verdicts]})
        return EXIT_OK if ok else EXIT_FINDINGS
    for v in verdicts:
        audit = "passes" if v.report.ok else f"FAILS: {v.report.errors[0].message}"
        admitted = "admitted" if v.refused is None else f"excluded ({v.refused})"
        mark = "ok " if v.ok else "ERR"
        console.print(f"{mark} {v.torch}: {admitted}; audit {audit}", markup=False, soft_wrap=True)
    if not ok:
        console.print("fix: an admitted torch must pass: narrow the package's run requirement on pytorch to the "
                      "builds it passes against (a version bound, a CUDA build pattern such as `cuda13*`), "
                      "or rebuild for that torch", markup=False, soft_wrap=True)
    return EXIT_OK if ok else EXIT_FINDINGS
