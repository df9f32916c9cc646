"""Site mirrors in pixi's own form: the `[mirrors]` table of pixi's config.toml.

A lock names the channels of the manifest (`https://conda.anaconda.org/conda-forge`,
`https://conda.internal.example/extforge`); where a site serves them is configuration of the
site, not of the lock. pixi reads

    [mirrors]
    "https://conda.anaconda.org/conda-forge" = ["https://mirror.example/conda-forge"]

from its config files and redirects every download whose URL starts with a key to the first
mirror (a key may be a whole host). extforge reads the same files, in pixi's order (later wins):
/etc/pixi/config.toml, ~/.config/pixi/config.toml, $XDG_CONFIG_HOME/pixi/config.toml,
~/.pixi/config.toml, $PIXI_HOME/config.toml, <workspace>/.pixi/config.toml, then
[tool.extforge.channel-map] of the manifest, $EXTFORGE_CHANNEL_MAP and --channel-map, which are
spellings of one mirror each (`conda-forge=file:///nfs/conda/mirror`). Unlike pixi, extforge
also follows mirrors that are folders (file://).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..errors import ExtforgeError

CHANNEL_MAP_ENV = "EXTFORGE_CHANNEL_MAP"


@dataclass(frozen=True)
class Mirrors:
    """Canonical URL prefix → mirror URLs, first one used (as pixi does)."""

    table: dict[str, list[str]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # where the entries came from, for messages

    def merged(self, other: Mirrors) -> Mirrors:
        return Mirrors(self.table | other.table, self.sources + other.sources)

    def _match(self, url: str) -> str | None:
        keys = [k for k in self.table if url == k.rstrip("/") or url.startswith(k.rstrip("/") + "/")]
        return max(keys, key=len, default=None)

    def redirect(self, url: str) -> str:
        """Where url is fetched from at this site (url itself when no key covers it)."""
        key = self._match(url)
        if key is None or not self.table[key]:
            return url
        return self.table[key][0].rstrip("/") + url[len(key.rstrip("/")):]


def pixi_config_paths(workspace: Path | None) -> list[Path]:
    """pixi's config files, lowest priority first (pixi's documented order on Linux)."""
    home = Path.home()
    paths = [Path("/etc/pixi/config.toml"), home / ".config" / "pixi" / "config.toml"]
    if xdg := os.environ.get("XDG_CONFIG_HOME"):
        paths.append(Path(xdg) / "pixi" / "config.toml")
    paths.append(home / ".pixi" / "config.toml")
    if pixi_home := os.environ.get("PIXI_HOME"):
        paths.append(Path(pixi_home) / "config.toml")
    if workspace is not None:
        paths.append(workspace / ".pixi" / "config.toml")
    seen: list[Path] = []
    for p in paths:
        if p not in seen:
            seen.append(p)
    return seen


def read_pixi_mirrors(path: Path) -> Mirrors:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return Mirrors()
    except (OSError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ExtforgeError(f"cannot read pixi config {path}", str(exc), "fix or remove the file") from None
    table = data.get("mirrors", {})
    if not isinstance(table, dict) or not all(isinstance(v, list) and all(isinstance(u, str) for u in v) for v in table.values()):
        raise ExtforgeError(
            f"[mirrors] in {path} is not in pixi's form",
            "each key is a channel URL (or a prefix of one), each value a list of mirror URLs",
            '[mirrors]\n  "https://conda.anaconda.org/conda-forge" = ["https://mirror.example/conda-forge"]',
        )
    return Mirrors({k: [_as_url(u, path.parent) for u in v] for k, v in table.items()}, (str(path),) if table else ())


def _as_url(location: str, base: Path) -> str:
    if urlparse(location).scheme in ("http", "https", "file"):
        return location.rstrip("/")
    return (base / Path(location).expanduser()).resolve().as_uri()


def canonical_channel(channel: str, base: Path) -> str:
    """A manifest channel as pixi names it in a lock: a URL (a bare name is on conda.anaconda.org,
    a path an absolute file:// URL; pixi.lock refuses relative ones)."""
    if urlparse(channel).scheme in ("http", "https", "file"):
        return channel.rstrip("/")
    if channel.startswith((".", "/", "~")):
        return (base / Path(channel).expanduser()).resolve().as_uri()
    return f"https://conda.anaconda.org/{channel}"


def parse_channel_map(items: list[str], base: Path, source: str) -> Mirrors:
    """NAME=URL pairs: the mirror URL of manifest channel NAME (a name, URL or path)."""
    table = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ExtforgeError(
                f"bad channel mapping {item!r}", "expected NAME=URL", "e.g. --channel-map conda-forge=http://127.0.0.1:8000/mirror"
            )
        table[canonical_channel(name.strip(), base)] = [_as_url(url.strip(), base)]
    return Mirrors(table, (source,) if table else ())


def site_mirrors(workspace: Path | None, manifest_map: dict[str, str] | None = None, cli_map: list[str] | None = None) -> Mirrors:
    """All mirror configuration of this site, in priority order (later wins)."""
    base = workspace or Path.cwd()
    mirrors = Mirrors()
    for path in pixi_config_paths(workspace):
        mirrors = mirrors.merged(read_pixi_mirrors(path))
    if manifest_map:
        mirrors = mirrors.merged(parse_channel_map([f"{k}={v}" for k, v in manifest_map.items()], base, "[tool.extforge.channel-map]"))
    env_items = [i for i in os.environ.get(CHANNEL_MAP_ENV, "").split(",") if i.strip()]
    mirrors = mirrors.merged(parse_channel_map(env_items, base, f"${CHANNEL_MAP_ENV}"))
    return mirrors.merged(parse_channel_map(cli_map or [], base, "--channel-map"))


def add_channel_map_option(parser: argparse.ArgumentParser) -> None:
    """`--channel-map NAME=URL` for lock, install and verify: one mirror, as on the command line."""
    parser.add_argument(
        "--channel-map",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="fetch manifest channel NAME (a name such as conda-forge, or a URL) from URL: a mirror, like an "
        "entry of [mirrors] in pixi's config.toml, which is read too (repeatable; also $EXTFORGE_CHANNEL_MAP, "
        "comma-separated, and [tool.extforge.channel-map] in the manifest; the flag wins over the variable, "
        "the variable over the manifest, the manifest over pixi's config)",
    )
