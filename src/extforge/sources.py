"""Source cache for offline build nodes: sdists fetched once, stored by sha256.

A networked machine runs `extforge sources fetch`; the file lands at
`<root>/sha256/<hex>/<filename>` (root: `--dest`, e.g. shared storage, or
`cache_root()/sources`). Recipes list `file://${EXTFORGE_SOURCES}/sha256/<hex>/<filename>` as
their first source URL, so a build node with EXTFORGE_SOURCES=<root> never needs the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import engine, paths
from .channel.hashing import sha256_file
from .errors import ExtforgeError
from .ui import log


@dataclass(frozen=True)
class SourceSpec:
    name: str
    version: str
    urls: tuple[str, ...]
    sha256: str

    @property
    def filename(self) -> str:
        return self.urls[-1].rsplit("/", 1)[-1]

    @property
    def pip_requirement(self) -> str:
        return f"{self.name}=={self.version}"


def default_root() -> Path:
    return paths.cache_root() / "sources"


def stored_path(spec: SourceSpec, root: Path | None = None) -> Path:
    return (root or default_root()) / "sha256" / spec.sha256 / spec.filename


def _recipe_file(recipe: Path) -> Path:
    recipe = Path(recipe)
    return recipe / "recipe.yaml" if recipe.is_dir() else recipe


def read_spec(recipe: Path) -> SourceSpec:
    """The url source of a v1 recipe, rendered (jinja in URLs) with its own variant file."""
    path = _recipe_file(recipe)
    if not path.is_file():
        raise ExtforgeError(f"no recipe at {path}", fix="pass a recipe directory or recipe.yaml")
    variant_files = [p for p in (path.parent / "variants-offline.yaml", path.parent / "variants.yaml") if p.is_file()]
    rendered = engine.render(path, engine.load_variant_files(variant_files[:1]), target_platform="linux-64")
    d = rendered[0].recipe.to_dict()
    sources = [s for s in d.get("source", []) if "url" in s]
    if not sources or not sources[0].get("sha256"):
        raise ExtforgeError(
            f"{path} has no url source with a sha256",
            "the source cache stores files by their sha256 and refuses unverified downloads",
            "add `source: {url: ..., sha256: ...}` to the recipe",
        )
    url = sources[0]["url"]
    urls = tuple(url) if isinstance(url, list) else (url,)
    return SourceSpec(d["package"]["name"], str(d["package"]["version"]), urls, sources[0]["sha256"].lower())


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
            with urllib.request.urlopen(url, timeout=120) as response, target.open("wb") as out:
                shutil.copyfileobj(response, out)
            return target
        except OSError as exc:  # URLError is an OSError
            log.info("could not download %s: %s", url, exc)
    return None


def fetch(spec: SourceSpec, root: Path | None = None) -> tuple[Path, str]:
    """Store the verified sdist; returns (path, how) with how in {"cached", "pip", "url"}."""
    target = stored_path(spec, root)
    if target.is_file() and sha256_file(target) == spec.sha256:
        paths.mark_used(target.parent)
        return target, "cached"
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent.parent, prefix=".fetch-") as tmp:
        downloaded, how = _pip_download(spec, Path(tmp) / "pip"), "pip"
        if downloaded is None:
            (Path(tmp) / "url").mkdir()
            downloaded, how = _url_download(spec, Path(tmp) / "url"), "url"
        if downloaded is None:
            raise ExtforgeError(
                f"could not download {spec.pip_requirement}",
                f"pip download failed and none of {', '.join(spec.urls)} could be read",
                "run this on a machine with network (PyPI reachable), then copy "
                f"{(root or default_root())} to the build node",
            )
        actual = sha256_file(downloaded)
        if actual != spec.sha256:
            raise ExtforgeError(
                f"sha256 mismatch for {downloaded.name}: got {actual}, the recipe pins {spec.sha256}",
                f"the file {how} delivered is not the source the recipe was written for; nothing was stored",
                "check the recipe's source.sha256 and your package index/mirror",
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        # Same filesystem as the store, so readers never see a partial file.
        os.replace(downloaded, target)
        target.chmod(0o644)
    return target, how
