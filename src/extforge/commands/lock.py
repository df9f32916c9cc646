"""extforge lock: solve pixi.toml's environments and write pixi.lock plus envs/ exports."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK

HELP = "lock pixi.toml's environments into pixi.lock (and envs/*.explicit.txt, *.environment.yml); --check for staleness"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("pixi.toml"), help="the pixi manifest (default: ./pixi.toml)")
    parser.add_argument("--lock", type=Path, help="the lock file (default: pixi.lock next to the manifest)")
    parser.add_argument("--env", action="append", metavar="NAME", help="lock only these environments (repeatable)")
    parser.add_argument(
        "--channel-map",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="fetch manifest channel NAME from URL (repeatable). Also read from $EXTFORGE_CHANNEL_MAP "
        "(comma-separated) and [tool.extforge.channel-map] in the manifest; the flag wins over the variable, "
        "the variable over the manifest",
    )
    parser.add_argument("--check", action="store_true", help="only check that pixi.lock is current; exit 1 when stale")
    parser.epilog = "exit code: 0 locked (or current), 1 stale lock (--check), 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..channel.lock import lock, stale_reasons
    from ..channel.manifest import parse_channel_map, read_manifest
    from ..ui import console, emit_json, step

    manifest = read_manifest(args.manifest)
    lock_path = (args.lock or manifest.path.parent / "pixi.lock").resolve()
    if args.check:
        reasons = stale_reasons(manifest, lock_path, args.env)
        if args.json:
            emit_json({"lock": str(lock_path), "current": not reasons, "reasons": reasons})
        for r in reasons:
            console.print(f"stale: {r}", markup=False)
        if not reasons and not args.json:
            console.print(f"{lock_path.name} is current")
        return EXIT_FINDINGS if reasons else EXIT_OK
    mapping = dict(manifest.tool.get("channel-map", {}))
    env_map = os.environ.get("EXTFORGE_CHANNEL_MAP", "")
    mapping |= parse_channel_map([i for i in env_map.split(",") if i.strip()])
    mapping |= parse_channel_map(args.channel_map)
    with step(f"lock {manifest.path.name}", quiet=args.json):
        result = lock(manifest, lock_path, mapping, args.env)
    if args.json:
        emit_json(result.to_json())
    else:
        for name, count in result.environments.items():
            console.print(f"  {name}: {count} packages")
    return EXIT_OK
