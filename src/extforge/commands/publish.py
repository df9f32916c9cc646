"""extforge publish: add packages to a channel folder (atomic, locked, logged) or a server."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from ..errors import EXIT_OK, ExtforgeError
from ..options import add_wheel_index, manylinux_policy, option_type

HELP = ("publish built packages to a channel folder (or prefix.dev/Quetz/Artifactory) and/or their wheels to a "
        "per-torch wheel index, after their audit")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("packages", nargs="+", type=Path, metavar="PKG", help=".conda or .tar.bz2 files")
    parser.add_argument(
        "--channel",
        metavar="DIR|URL",
        help="a channel folder (path or file://), https://prefix.dev/CHANNEL, quetz+https://HOST/CHANNEL "
        "or artifactory+https://HOST/CHANNEL (key in $EXTFORGE_UPLOAD_API_KEY or rattler's auth file)",
    )
    parser.add_argument(
        "--allow-audit-failure", metavar="REASON", help="publish packages that fail the audit; the reason goes to the publish log"
    )
    parser.add_argument("--no-audit", action="store_true", help="do not run the audit (recorded as 'skipped')")
    add_wheel_index(parser, "also (or only) publish each package's wheel")
    parser.add_argument(
        "--manylinux", type=option_type(manylinux_policy), metavar="2_N",
        help="with --wheels: the site's target policy; a wheel whose binaries need more (glibc, libstdc++) is refused",
    )
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="URL|DIR",
        help="channel holding the pytorch the packages pin, which the audit resolves them against "
        "(repeatable; default: the target channel folder)",
    )
    parser.epilog = ("--channel, --wheels or both. exit code: 0 published, 1 refused (audit failure, name exists with "
                     "other bytes, a wheel needing more than --manylinux), 2 could not run")



def run(args: argparse.Namespace) -> int:
    from ..ui import emit_json

    if not args.channel and not args.wheels:
        raise ExtforgeError("nothing to publish to", "publish needs a channel, a wheel index or both",
                            "pass --channel DIR|URL and/or --wheels DIR")
    out: dict = {}
    if args.channel:
        out = publish_channel(args)
    if args.wheels:
        out["wheels"] = publish_wheel_index(args)
    if args.json:
        emit_json(out)
    return EXIT_OK


def publish_wheel_index(args: argparse.Namespace) -> dict:
    from ..publishing.publish import parse_channel
    from ..ui import console, step
    from ..wheel.publish import publish_conda_wheels

    upstream = list(args.upstream)
    if not upstream and args.channel and parse_channel(args.channel)[0] == "folder":
        upstream = [args.channel]
    with step(f"publish the wheels of {len(args.packages)} package(s) to {args.wheels}", quiet=args.json):
        result = publish_conda_wheels(args.packages, args.wheels, upstream=upstream, manylinux=args.manylinux,
                                      audit=not args.no_audit)
    if not args.json:
        for change in result.ignored:
            console.print(f"  warning: not listed (no publish log entry vouches for it): {change}", markup=False, soft_wrap=True)
        for w in result.wheels:
            console.print(f"  {w.status:16} {w.file}  audit {w.audit}", markup=False, soft_wrap=True)
    return result.to_json()


def publish_channel(args: argparse.Namespace) -> dict:
    from ..publishing.publish import publish
    from ..ui import console, step

    with step(f"publish {len(args.packages)} package(s) to {args.channel}", quiet=args.json):
        result = publish(args.packages, args.channel, allow_audit_failure=args.allow_audit_failure, audit=not args.no_audit, upstream=args.upstream)
    if not args.json:
        if result.created:
            mode = stat.filemode(os.stat(result.created[-1]).st_mode)
            console.print(f"  created the channel folder {result.created[-1]} ({mode}): it did not exist",
                          markup=False, soft_wrap=True)
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
    return result.to_json()
