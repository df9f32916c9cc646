"""extforge lock: solve pixi.toml's environments and write pixi.lock plus envs/ exports."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..environment.mirrors import add_channel_map_option
from ..errors import EXIT_FINDINGS, EXIT_OK

HELP = ("lock pixi.toml's environments into pixi.lock (and envs/*.explicit.txt, *.environment.yml, *.conda-lock.yml), "
        "their [pypi-dependencies] into pylock.<env>.toml; --check for staleness")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("pixi.toml"), help="the pixi manifest (default: ./pixi.toml)")
    parser.add_argument("--lock", type=Path, help="the lock file (default: pixi.lock next to the manifest)")
    parser.add_argument("--env", action="append", metavar="NAME", help="lock only these environments (repeatable)")
    add_channel_map_option(parser)
    parser.add_argument("--check", action="store_true", help="only check that pixi.lock is current; exit 1 when stale")
    parser.epilog = "exit code: 0 locked (or current), 1 stale lock (--check), 2 could not run"


def run(args: argparse.Namespace) -> int:
    from ..environment.lock import lock, stale_reasons
    from ..environment.manifest import read_manifest
    from ..environment.mirrors import site_mirrors
    from ..ui import console, emit_json, step

    manifest = read_manifest(args.manifest)
    if not args.json:
        for note in manifest.deprecations:
            console.print(f"warning: {note}", markup=False, soft_wrap=True, style="yellow")
    given = args.lock or manifest.path.parent / "pixi.lock"
    # The folder is resolved, not the file: a pixi.lock that is a planted symlink is replaced, not followed.
    lock_path = given.parent.resolve() / given.name
    if args.check:
        reasons = stale_reasons(manifest, lock_path, args.env)
        if args.json:
            emit_json({"lock": str(lock_path), "current": not reasons, "reasons": reasons})
        for r in reasons:
            console.print(f"stale: {r}", markup=False)
        if not reasons and not args.json:
            console.print(f"{lock_path.name} is current")
        return EXIT_FINDINGS if reasons else EXIT_OK
    mirrors = site_mirrors(manifest.path.parent, manifest.tool.get("channel-map", {}), args.channel_map)
    with step(f"lock {manifest.path.name}", quiet=args.json):
        result = lock(manifest, lock_path, mirrors, args.env)
    if args.json:
        emit_json(result.to_json() | {"mirrors": mirrors.table, "mirror_sources": list(mirrors.sources), "warnings": manifest.deprecations})
    else:
        for name, count in result.environments.items():
            wheels = f", {result.pypi[name]} PyPI wheels in pylock.toml" if name in result.pypi else ""
            console.print(f"  {name}: {count} packages{wheels}")
    return EXIT_OK
