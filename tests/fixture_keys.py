"""Keys of the fixtures that builds make (demo-ext on the mirror channel, the seed rows' builds):
what a built package depends on, so that a fixture is built again when, and only when, that changed."""

import hashlib
import json
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "extforge"


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def channel_digest(channel: Path) -> str:
    """The channel's packages (subdir, file name, sha256) and its variants.yaml. Not the text of
    its repodata: rattler's index stamps each record with the time of indexing, so a channel
    mirrored again from the same cached packages gave every session a new key and a new build."""
    h = hashlib.sha256()
    for subdir in ("noarch", "linux-64"):
        repodata = channel / subdir / "repodata.json"
        if repodata.is_file():
            data = json.loads(repodata.read_text())
            for fn, record in sorted({**data.get("packages", {}), **data.get("packages.conda", {})}.items()):
                h.update(f"{subdir}/{fn}\0{record['sha256']}\n".encode())
    variants = channel / "variants.yaml"
    if variants.is_file():
        h.update(variants.read_bytes())
    return h.hexdigest()


def build_key(recipe: Path, channel: Path) -> str:
    """The recipe, the channel, and extforge's build, audit and stamp code."""
    builder = tree_digest(SRC / "audit") + "".join((SRC / f).read_text() for f in ("building/build.py", "engine.py", "stamp.py"))
    return hashlib.sha256((tree_digest(recipe) + builder + channel_digest(channel)).encode()).hexdigest()[:16]
