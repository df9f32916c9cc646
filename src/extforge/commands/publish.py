"""extforge publish: add packages to a channel folder (atomic, locked, logged) or a server."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_OK

HELP = "publish built packages to a channel folder (or prefix.dev/Quetz/Artifactory) after their audit"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("packages", nargs="+", type=Path, metavar="PKG", help=".conda or .tar.bz2 files")
    parser.add_argument(
        "--channel",
        required=True,
        metavar="DIR|URL",
        help="a channel folder (path or file://), https://prefix.dev/CHANNEL, quetz+https://HOST/CHANNEL "
        "or artifactory+https://HOST/CHANNEL (key in $EXTFORGE_UPLOAD_API_KEY or rattler's auth file)",
    )
    parser.add_argument(
        "--allow-audit-failure", metavar="REASON", help="publish packages that fail the audit; the reason goes to the publish log"
    )
    parser.add_argument("--no-audit", action="store_true", help="do not run the audit (recorded as 'skipped')")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="URL|DIR",
        help="channel holding the pytorch the packages pin, which the audit resolves them against "
        "(repeatable; default: the target channel folder)",
    )
    parser.epilog = "exit code: 0 published, 1 refused (audit failure, name exists with other bytes), 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..channel.publish import publish
    from ..ui import console, emit_json, step

    with step(f"publish {len(args.packages)} package(s) to {args.channel}", quiet=args.json):
        result = publish(args.packages, args.channel, allow_audit_failure=args.allow_audit_failure, audit=not args.no_audit, upstream=args.upstream)
    if args.json:
        emit_json(result.to_json())
    else:
        if result.log_repaired:
            console.print(f"  publish log repaired: {len(result.log_repaired)} package file(s) in the channel had no entry "
                          f"(a publish killed mid-way, or files put there by another tool): {', '.join(result.log_repaired)}",
                          markup=False, soft_wrap=True)
        if result.repodata_rebuilt:
            console.print(f"  repodata.json of {', '.join(result.repodata_rebuilt)} was damaged (empty, truncated or not an "
                          "index) and was rebuilt from the package files", markup=False, soft_wrap=True)
        for change in result.changed_behind:
            console.print(f"  warning: changed behind the publish log: {change}", markup=False, soft_wrap=True)
        if result.ignored:
            console.print(f"  warning: {len(result.ignored)} file(s) in the channel are not served: {'; '.join(result.ignored)}. "
                          f"Someone with write access put them there (or a copy broke): remove them from {args.channel}, "
                          "or put the published bytes back", markup=False, soft_wrap=True)
        for p in result.packages:
            note = f" (audit override: {p.audit_override})" if p.audit_override else ""
            console.print(f"  {p.status:16} {p.subdir}/{p.file}  audit {p.audit}{note}", markup=False)
    return EXIT_OK
