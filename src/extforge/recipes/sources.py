"""Source cache for offline build nodes: a recipe's source archives fetched once, stored by sha256.

A networked machine runs `extforge sources fetch`; each file lands at
`<root>/sha256/<hex>/<filename>` (root: `--dest`, e.g. shared storage, or
`cache_root()/sources`). Recipes list `file://${EXTFORGE_SOURCES}/sha256/<hex>/<filename>` as
their first source URL. `extforge build` renders them with EXTFORGE_SOURCES set to the root it
reads ($EXTFORGE_SOURCES, else the default that `sources fetch` fills) and fetches what that
root lacks into it first (`for_build`), so rattler-build reads every source from there and
never downloads one; a build node whose root holds them never needs the network.
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
from typing import Any

from .. import downloads, engine, paths, safe_files
from ..channel_ref import channel_url
from ..errors import ExtforgeError
from ..hashing import sha256_file
from ..ui import log
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


ENV = "EXTFORGE_SOURCES"


def default_root() -> Path:
    return paths.cache_root() / "sources"


def build_root() -> Path:
    """The source cache a build reads: $EXTFORGE_SOURCES, else the one `sources fetch` fills by default."""
    env = os.environ.get(ENV)
    return Path(env).expanduser().absolute() if env else default_root()


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
    """Every url source of a v1 recipe (at least one): its context, package and source sections
    rendered (jinja in URLs) with its own variant file and, when given, the channels' variants."""
    path = _recipe_file(recipe)
    variant_files = [p for p in (path.parent / "variants-offline.yaml", path.parent / "variants.yaml") if p.is_file()]
    config = engine.load_variant_files([*variant_files[:1], *channel_files([channel_url(c) for c in channels])])
    found = url_specs(recipe, config)
    if not found:
        raise _unverified(path, "no url source with")
    return found


def _unverified(path: Path, what: str) -> ExtforgeError:
    return ExtforgeError(f"{path} has {what} a sha256",
                         "the source cache stores files by their sha256 and refuses unverified downloads",
                         "give every url source of the recipe a sha256: `source: {url: ..., sha256: ...}`")


def url_specs(recipe: Path, config: Any) -> list[SourceSpec]:
    """Every url source of a v1 recipe (none for a recipe of local folders): its context, package
    and source sections rendered under `config` (a rattler_build VariantConfig)."""
    path = _recipe_file(recipe)
    if not path.is_file():
        raise ExtforgeError(f"no recipe at {path}", fix="pass a recipe directory or recipe.yaml")
    with tempfile.TemporaryDirectory(prefix="extforge-sources-") as tmp:
        part = Path(tmp) / "recipe.yaml"
        safe_files.write_atomic(part, source_sections(path.read_text()).encode())
        try:
            rendered = [v.recipe.to_dict() for v in engine.render(part, config, target_platform="linux-64")]
        except BaseException as exc:
            if not engine.engine_failure(exc):
                raise
            raise ExtforgeError(f"cannot read the sources of {path}", engine.engine_message(exc).splitlines()[0],
                                "fix the recipe (a url source needs its sha256: 64 hex digits)") from exc
    d = rendered[0]
    found = list({json.dumps(s, sort_keys=True): s for r in rendered for s in r.get("source", []) if "url" in s}.values())
    if any(not s.get("sha256") for s in found):
        raise _unverified(path, "a url source without")
    name, version = d["package"]["name"], str(d["package"]["version"])
    return [SourceSpec(name, version, tuple(s["url"]) if isinstance(s["url"], list) else (s["url"],),
                       s["sha256"].lower()) for s in found]


def for_build(recipe: Path, config: Any, root: Path) -> list[tuple[SourceSpec, Path]]:
    """Every url source of the recipe under the build's variant `config` and its file in the
    source cache `root`, fetched there (verified) where missing, for a build whose recipe is
    rendered with EXTFORGE_SOURCES=`root`: its first URL must then name that file, else
    rattler-build would download the source itself."""
    with engine.environment({ENV: str(root)}):
        specs = url_specs(recipe, config)
    out = []
    fill = f"extforge sources fetch {_recipe_file(recipe).parent} --dest {root}"
    for spec in specs:
        stored = stored_path(spec, root)
        if spec.urls[0] not in (f"file://{stored}", stored.as_uri()):
            raise ExtforgeError(
                f"{_recipe_file(recipe)}: its source {spec.urls[0]} would be downloaded by rattler-build during the build",
                "extforge fetches every source itself (verified by its sha256) into the source cache, and the build "
                "reads it from there: an offline build node cannot download",
                f"list the source cache's file first under `url:`: `file://${{{{ env.get(\"{ENV}\", "
                f"default=\"/nonexistent\") }}}}/sha256/{spec.sha256}/{spec.filename}` (as `extforge recipe new` writes it)",
            )
        try:
            out.append((spec, fetch(spec, root)[0]))
        except OSError as exc:
            raise ExtforgeError(f"cannot store {spec.filename} in the source cache {root}", str(exc),
                                f"point {ENV} at a source cache you can write, or fill it with `{fill}` as its owner") from exc
        except ExtforgeError as exc:
            raise ExtforgeError(exc.what, exc.why, f"run `{fill}` on a machine with network (--from DIR for archives "
                                "no index serves)" + ("" if root == default_root() else f", then build with {ENV}={root}")) from exc
    return out


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
