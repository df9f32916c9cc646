"""`extforge sources fetch|path`: the offline source cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_OK, ExtforgeError
from ..ui import console, emit_json, step

HELP = "fetch a recipe's source archives into the offline source cache, verified by sha256"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("fetch", "path"),
                        help="fetch: take each source from --from folders, pip (a package's sdist) or the recipe's "
                        "URLs, check its sha256, store it; path: print where each source is cached")
    parser.add_argument("recipe", type=Path, help="recipe dir or recipe.yaml")
    parser.add_argument("--dest", type=Path, default=None,
                        help="cache root (e.g. on shared storage); default <cache root>/sources")
    parser.add_argument("--from", dest="from_dirs", type=Path, action="append", default=[], metavar="DIR",
                        help="a folder holding source archives by file name (e.g. git archives no index serves); "
                        "looked at first, repeatable")
    parser.add_argument("-c", "--channel", dest="channels", action="append", default=[], metavar="CHANNEL",
                        help="a channel whose variants.yaml (written by `extforge mirror`) fills the variant keys the "
                        "recipe's sources name (python, pytorch, ...); repeatable")


def run(args: argparse.Namespace) -> int:
    from ..recipes import sources

    specs = sources.read_specs(args.recipe, args.channels)
    root = args.dest.resolve() if args.dest else sources.default_root()
    if args.action == "path":
        targets = [sources.stored_path(spec, root) for spec in specs]
        if args.json:
            emit_json({"sources": [{"path": str(t), "exists": t.is_file()} for t in targets], "sources_root": str(root)})
        else:
            print("\n".join(map(str, targets)))
        missing = [t.name for t in targets if not t.is_file()]
        if missing:
            raise ExtforgeError(f"not in the source cache yet: {', '.join(missing)}",
                                fix=f"run `extforge sources fetch {args.recipe}` on a machine with network "
                                "(or with --from DIR where the archives are)")
        return EXIT_OK
    fetched = []
    for spec in specs:
        with step(f"fetch {spec.filename}", quiet=args.json):
            fetched.append((spec, *sources.fetch(spec, root, args.from_dirs)))
    if args.json:
        emit_json({"sources": [{"path": str(t), "sha256": s.sha256, "how": how} for s, t, how in fetched],
                   "sources_root": str(root)})
    else:
        where = ("`extforge build` on this machine reads it as it is" if root == sources.build_root() else
                 f"`extforge build` reads it with EXTFORGE_SOURCES={root} (export it on the build nodes)")
        console.print("\n".join(f"{t} ({how})" for _, t, how in fetched) + f"\n{where}", markup=False, soft_wrap=True)
    return EXIT_OK
