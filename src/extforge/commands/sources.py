"""`extforge sources fetch|path`: the offline source cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_OK, ExtforgeError
from ..ui import console, emit_json, step

HELP = "fetch a recipe's source (sdist) into the offline source cache, verified by sha256"
DEFAULT_RECIPE = Path("recipe/flash-attn")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("fetch", "path"),
                        help="fetch: download (pip, else the recipe's URLs), check sha256, store; "
                        "path: print where the source is cached")
    parser.add_argument("recipe", nargs="?", type=Path, default=DEFAULT_RECIPE, help="recipe dir or recipe.yaml")
    parser.add_argument("--dest", type=Path, default=None,
                        help="cache root (e.g. on shared storage); default <cache root>/sources")


def run(args: argparse.Namespace) -> int:
    from .. import sources

    spec = sources.read_spec(args.recipe)
    root = args.dest.resolve() if args.dest else sources.default_root()
    if args.action == "path":
        target = sources.stored_path(spec, root)
        if args.json:
            emit_json({"path": str(target), "exists": target.is_file(), "sources_root": str(root)})
        else:
            print(target)
        if not target.is_file():
            raise ExtforgeError(f"{spec.filename} is not in the source cache yet",
                                fix=f"run `extforge sources fetch {args.recipe}` on a machine with network")
        return EXIT_OK
    with step(f"fetch {spec.pip_requirement}", quiet=args.json):
        target, how = sources.fetch(spec, root)
    if args.json:
        emit_json({"path": str(target), "sha256": spec.sha256, "how": how, "sources_root": str(root)})
    else:
        console.print(f"{target} ({how})\nbuild nodes: export EXTFORGE_SOURCES={root}", markup=False)
    return EXIT_OK
