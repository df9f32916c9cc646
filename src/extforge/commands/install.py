"""extforge install: create an environment exactly as pixi.lock says, verified, without a solve."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..environment.mirrors import add_channel_map_option
from ..errors import EXIT_OK

HELP = "install a locked environment into a prefix (no solve; every package hash-checked before linking)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", metavar="ENV", help="environment name in the lock")
    parser.add_argument("--prefix", type=Path, required=True, help="where to create it (must be new or empty)")
    parser.add_argument("--lock", type=Path, default=Path("pixi.lock"), help="the lock file (default: ./pixi.lock)")
    parser.add_argument(
        "--manifest", type=Path, help="refuse when the lock is stale relative to this pixi.toml (default: next to the lock, if there)"
    )
    parser.add_argument("--rehash", action="store_true",
                        help="hash every file linked from the package cache, not only those changed since an install "
                             "verified them, and every package archive")
    add_channel_map_option(parser)
    parser.epilog = ("downloads stop at the size the lock names and fail when less than 64 KiB arrives in "
                     "$EXTFORGE_DOWNLOAD_STALL_SECONDS (default 60). "
                     "exit code: 0 installed, 1 refused (stale lock, hash mismatch, unsafe archive), "
                     "2 could not run (also: another install is running into the same prefix)")


def run(args: argparse.Namespace) -> int:
    from .. import ui
    from ..environment.install import install_env
    from ..environment.lock import require_current
    from ..environment.manifest import read_manifest
    from ..environment.mirrors import site_mirrors
    from ..ui import emit_json, step

    lock_path = args.lock.resolve()
    manifest_path = args.manifest or lock_path.parent / "pixi.toml"
    manifest = read_manifest(manifest_path) if args.manifest or manifest_path.is_file() else None
    if manifest is not None:
        require_current(manifest, lock_path, [args.env])
    mirrors = site_mirrors(lock_path.parent, manifest.tool.get("channel-map", {}) if manifest else None, args.channel_map)
    with step(f"install {args.env} into {args.prefix}", quiet=args.json):
        result = install_env(lock_path, args.env, args.prefix, mirrors=mirrors, rehash=args.rehash)
    # The environment's [pypi-dependencies] are locked beside pixi.lock, for pip or uv to install.
    pylocks = sorted(lock_path.parent.glob(f"pylock.{args.env}*.toml")) if manifest and manifest.env(args.env).pypi else []
    if args.json:
        emit_json(result.to_json() | {"pylocks": [str(p) for p in pylocks]})
    else:
        console = ui.console  # rich, imported where a human reads the output
        for f in result.cache_mismatches:
            console.print(f"  repaired {f}: the cache's copy differed from the package the lock names", markup=False, style="yellow")
        console.print(f"  {result.status}: {result.packages} packages in {result.prefix}", markup=False)
        for pylock in pylocks:
            console.print(f"  its PyPI packages: {result.prefix}/bin/python -m pip install -r {pylock} "
                          f"(or uv pip sync --python {result.prefix}/bin/python {pylock})", markup=False)
    return EXIT_OK
