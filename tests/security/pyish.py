"""A package shaped like a Python extension for the install/verify cases, and the edits an
attacker who can write a prefix makes to it."""

from __future__ import annotations

import json
from pathlib import Path

from extforge.publishing.index import reindex

# rattler-build's placeholder is this long too: a binary rewrite needs room for the real prefix.
PLACEHOLDER = "/home/builder/placehold" + "_placehold" * 23
SITE = "lib/python3.11/site-packages"
MODULE = f"{SITE}/pyish/__init__.py"


def pyish_package(channel: Path) -> Path:
    """A hand-made package shaped like a Python extension's: a module, its own .pth, a script whose
    shebang holds the prefix placeholder (text) and a library with it in a C string (binary).
    The channel is indexed."""
    from .crafted import craft_package, member, paths_entries

    members = [
        member(MODULE, b"VALUE = 1\n"),
        member(f"{SITE}/pyish-paths.pth", b"pyish\n"),
        member("bin/pyish", f"#!{PLACEHOLDER}/bin/python3.11\nprint('{PLACEHOLDER}')\n".encode(), mode=0o755),
        member("lib/libpyish.so", b"\x7fELF\0\0RUNPATH=" + PLACEHOLDER.encode() + b"/lib:" + PLACEHOLDER.encode() + b"/x\0tail\0"),
    ]
    paths = paths_entries(members)
    for entry in paths:
        if entry["_path"] in ("bin/pyish", "lib/libpyish.so"):
            entry["prefix_placeholder"] = PLACEHOLDER
            entry["file_mode"] = "binary" if entry["_path"].endswith(".so") else "text"
    pkg = craft_package(channel / "noarch", "pyish", members, paths=paths)
    reindex(channel)
    return pkg


def conda_meta(prefix: Path, name: str) -> Path:
    (record,) = (prefix / "conda-meta").glob(f"{name}-*.json")
    return record


def forge_record(prefix: Path, name: str, rel: str, data: bytes) -> None:
    """Replace a file of an installed package and rewrite its conda-meta record to match, as
    anyone who can write the prefix can (hash and size of the new bytes)."""
    import hashlib

    path = prefix / rel
    path.unlink()  # a new inode: installed files may be hard links into the package cache
    path.write_bytes(data)
    record = conda_meta(prefix, name)
    meta = json.loads(record.read_text())
    for entry in meta["paths_data"]["paths"]:
        if entry["_path"] == rel:
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            entry.pop("sha256_in_prefix", None)
            entry["size_in_bytes"] = len(data)
    record.write_text(json.dumps(meta))
