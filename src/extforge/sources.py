"""Source cache for offline build nodes: a recipe's source archives fetched once, stored by sha256.

A networked machine runs `extforge sources fetch`; each file lands at
`<root>/sha256/<hex>/<filename>` (root: `--dest`, e.g. shared storage, or
`cache_root()/sources`). Recipes list `file://${EXTFORGE_SOURCES}/sha256/<hex>/<filename>` as
their first source URL, so a build node with EXTFORGE_SOURCES=<root> never needs the network.
Archives no index serves (git archives of upstream trees, e.g. FlashAttention-3's hopper/) come
from a folder the site already holds (`--from DIR`), checked against the same sha256.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import downloads, engine, paths, safe_files
from .channel.hashing import sha256_file
from .channel_ref import channel_url
from .errors import ExtforgeError
from .ui import log
from .variants import channel_files


@dataclass(frozen=True)
class SourceSpec:
    name: str
    version: str
    urls: tuple[str, ...]
    sha256: str

    @property
    def filename(self) -> str:
        return downloads.url_file_name(self.urls[-1])

    @property
    def pip_requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def is_sdist(self) -> bool:
        """The package's own sdist (pip can fetch it), not another archive the recipe unpacks."""
        stem = self.filename.removesuffix(".tar.gz").removesuffix(".zip")
        return stem.replace("-", "_").lower() == f"{self.name}_{self.version}".replace("-", "_").lower()


def default_root() -> Path:
    return paths.cache_root() / "sources"


def stored_path(spec: SourceSpec, root: Path | None = None) -> Path:
    return (root or default_root()) / "sha256" / spec.sha256 / spec.filename


def _recipe_file(recipe: Path) -> Path:
    recipe = Path(recipe)
    return recipe / "recipe.yaml" if recipe.is_dir() else recipe


# What decides a recipe's sources: a build string or a requirement naming variant keys that only
# the channel's variants.yaml defines (python, pytorch, the CUDA toolkit) has no bearing on them.
SOURCE_SECTIONS = ("schema_version", "context", "package", "source")


def source_sections(recipe_text: str) -> str:
    """The recipe's SOURCE_SECTIONS as written (a YAML round trip would turn a sha256 of digits
    into a number): each top-level key's line and those below it."""
    keep, out = False, []
    for line in recipe_text.splitlines():
        if m := re.match(r"([A-Za-z_][\w-]*)\s*:", line):
            keep = m[1] in SOURCE_SECTIONS
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def read_specs(recipe: Path, channels: Sequence[str] = ()) -> list[SourceSpec]:
    """Every url source of a v1 recipe: its context, package and source sections rendered (jinja
    in URLs) with its own variant file and, when given, the channels' variants."""
    path = _recipe_file(recipe)
    if not path.is_file():
        raise ExtforgeError(f"no recipe at {path}", fix="pass a recipe directory or recipe.yaml")
    variant_files = [p for p in (path.parent / "variants-offline.yaml", path.parent / "variants.yaml") if p.is_file()]
    with tempfile.TemporaryDirectory(prefix="extforge-sources-") as tmp:
        part = Path(tmp) / "recipe.yaml"
        safe_files.write_atomic(part, source_sections(path.read_text()).encode())
        config = engine.load_variant_files([*variant_files[:1], *channel_files([channel_url(c) for c in channels])])
        try:
            rendered = [v.recipe.to_dict() for v in engine.render(part, config, target_platform="linux-64")]
        except BaseException as exc:
            if not engine.engine_failure(exc):
                raise
            raise ExtforgeError(f"cannot read the sources of {path}", engine.engine_message(exc).splitlines()[0],
                                "fix the recipe (a url source needs its sha256: 64 hex digits)") from exc
    d = rendered[0]
    found = list({json.dumps(s, sort_keys=True): s for r in rendered for s in r.get("source", []) if "url" in s}.values())
    unverified = [s for s in found if not s.get("sha256")]
    if not found or unverified:
        raise ExtforgeError(
            f"{path} has {'a url source without' if unverified else 'no url source with'} a sha256",
            "the source cache stores files by their sha256 and refuses unverified downloads",
            "give every url source of the recipe a sha256: `source: {url: ..., sha256: ...}`",
        )
    name, version = d["package"]["name"], str(d["package"]["version"])
    return [SourceSpec(name, version, tuple(s["url"]) if isinstance(s["url"], list) else (s["url"],),
                       s["sha256"].lower()) for s in found]


def read_spec(recipe: Path) -> SourceSpec:
    """The recipe's first url source (its sdist, for recipes built from one)."""
    return read_specs(recipe)[0]


def _from_folders(spec: SourceSpec, folders: Sequence[Path], into: Path) -> Path | None:
    """A copy of the file named like the source in one of `folders` (checked by the caller)."""
    for folder in folders:
        candidate = Path(folder) / spec.filename
        if candidate.is_file():
            into.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(candidate, into / spec.filename)
            return into / spec.filename
    return None


def _pip_download(spec: SourceSpec, into: Path) -> Path | None:
    """pip download honours the site's index/proxy configuration (pip.conf, PIP_* variables).

    pip builds an sdist's metadata after downloading it; sdists whose setup.py imports torch
    (flash-attn) fail there, and then the recipe's own URLs are used instead.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "--disable-pip-version-check", "-d", str(into), spec.pip_requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        log.info("pip download %s failed, trying the recipe's URLs: %s", spec.pip_requirement, proc.stderr[-500:])
        return None
    found = [p for p in into.iterdir() if p.is_file()]
    return found[0] if len(found) == 1 else None


def _url_download(spec: SourceSpec, into: Path) -> Path | None:
    for url in spec.urls:
        target = into / spec.filename
        try:
            downloads.download(url, target)
            return target
        except ExtforgeError as exc:
            log.info("could not download %s: %s (%s)", url, exc.what, exc.why)
    return None


def fetch(spec: SourceSpec, root: Path | None = None, from_dirs: Sequence[Path] = ()) -> tuple[Path, str]:
    """Store the verified archive; returns (path, how) with how in {"cached", "folder", "pip", "url"}."""
    target = stored_path(spec, root)
    if target.is_file() and sha256_file(target) == spec.sha256:
        paths.mark_used(target.parent)
        return target, "cached"
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent.parent, prefix=".fetch-") as tmp:
        downloaded, how = _from_folders(spec, from_dirs, Path(tmp) / "folder"), "folder"
        if downloaded is None and spec.is_sdist:
            downloaded, how = _pip_download(spec, Path(tmp) / "pip"), "pip"
        if downloaded is None:
            (Path(tmp) / "url").mkdir()
            downloaded, how = _url_download(spec, Path(tmp) / "url"), "url"
        if downloaded is None:
            tried = [*(f"{Path(d) / spec.filename}" for d in from_dirs), *(["pip download"] if spec.is_sdist else []),
                     *spec.urls]
            raise ExtforgeError(
                f"could not get {spec.filename} for {spec.pip_requirement}",
                f"none of these had it: {', '.join(tried)}",
                "run this on a machine with network (PyPI reachable), or pass --from DIR with a folder that "
                f"holds {spec.filename}; then copy {(root or default_root())} to the build node",
            )
        actual = sha256_file(downloaded)
        if actual != spec.sha256:
            raise ExtforgeError(
                f"sha256 mismatch for {downloaded.name}: got {actual}, the recipe pins {spec.sha256}",
                f"the file {how} delivered is not the source the recipe was written for; nothing was stored",
                "check the recipe's source sha256 and where the file came from (index, mirror or --from folder)",
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        # Same filesystem as the store, so readers never see a partial file.
        os.replace(downloaded, target)
        target.chmod(0o644)
    return target, how
