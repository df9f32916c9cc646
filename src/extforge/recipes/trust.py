"""Whose code a recipe is: its build scripts, `script:` lines, patches, the Jinja it renders and
its tests run as the builder (often root). A site keeps recipes on shared storage (a group's
folder, 2775, umask 002), so before any of it runs, the recipe folder, everything below it and
every folder above it must be writable by nobody but the builder and root (paths.who_else_may_write,
OpenSSH's StrictModes rule); the build then reads a copy taken in that same pass, never the
folder again.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import paths, safe_files
from ..errors import ExtforgeError

# A recipe folder with its `path:` sources (demo-ext's `src/`) is small; this bounds a copy of a
# folder that also holds a checkout's build trees.
COPY_LIMIT = 2 * 2**30


def checked(recipe_file: Path, into: Path | None = None) -> Path:
    """The recipe file, once its folder, every file and folder below it and every folder above it
    passed the rule; with `into` (a new folder of this user's alone), of the copy of the folder
    made there in the same pass: the files read are the files checked. Refused naming the path
    and who may write it."""
    folder = recipe_file.parent.resolve()
    for above in reversed(folder.parents):
        if who := paths.who_else_may_write(above.lstat(), sticky_folder_ok=True):
            raise _refusal(folder, above, who, "they can rename the recipe folder away and put theirs in its place")

    def vet(path: Path, st: os.stat_result) -> None:
        if who := paths.who_else_may_write(st):
            raise _refusal(folder, path, who, "a recipe is code: its build scripts, patches and tests run as you")

    copy = into / folder.name if into else None
    try:
        safe_files.copy_tree(folder, copy, vet=vet, limit=COPY_LIMIT)
    except safe_files.Refused as exc:
        raise ExtforgeError(f"refusing to run the recipe {folder}: {exc.path}: {exc.reason}",
                            "extforge builds a copy of the recipe folder, of its regular files and folders, "
                            "and of links that stay inside it",
                            f"replace {exc.path} by what it stands for") from None
    except OSError as exc:
        raise ExtforgeError(f"cannot copy the recipe {folder}: {exc.filename or folder}: {exc.strerror}",
                            "a build reads a copy of the recipe folder, made in its private work folder as it is "
                            "checked", "make the recipe's files readable to you, or free space where the build "
                            "works (the cache root)") from None
    return (copy or folder) / recipe_file.name


def _refusal(folder: Path, path: Path, who: str, how: str) -> ExtforgeError:
    mine = Path("~/recipes") / folder.name
    return ExtforgeError(
        f"refusing to run the recipe {folder}: {path}: {who}",
        f"{how}; an edit of theirs would run as you (uid {os.geteuid()}) at the next build",
        f"if nobody else should change it, `chmod g-w,o-w {shlex.quote(str(path))}` as its owner; else review the "
        f"recipe and build a copy of your own: `cp -r {shlex.quote(str(folder))} ~/recipes/ && extforge build {mine}`")


def outside_sources(rendered: Sequence[Any], recipe_file: Path) -> None:
    """Refuse a `path:` source out of the recipe folder: the build reads its checked copy, where
    such a path leads nowhere (or to what nobody checked)."""
    for variant in rendered:
        for source in variant.recipe.to_dict().get("source", []):
            where = source.get("path")
            if where is not None and os.path.normpath(os.path.join(".", where)).split(os.sep)[0] in ("..", ""):
                raise ExtforgeError(
                    f"{recipe_file}: its source `path: {where}` is out of the recipe folder",
                    "a build reads a copy of the recipe folder, checked as it is copied: nobody else may have "
                    "written what it runs",
                    "move the source into the recipe folder (`path: src`), or publish it as an archive with its "
                    "sha256 (`url:`)")
