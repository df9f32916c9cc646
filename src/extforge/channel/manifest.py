"""Read a pixi.toml (the subset extforge locks: channels, platforms, system requirements,
dependencies of features, environments) into plain data, and map channels to where they are
served on this machine.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..errors import ExtforgeError

DEFAULT_FEATURE = "default"
# pixi's defaults when [system-requirements] does not say otherwise.
DEFAULT_GLIBC = "2.28"
DEFAULT_LINUX = "4.18"


@dataclass(frozen=True)
class Feature:
    dependencies: dict[str, str | dict] = field(default_factory=dict)
    channels: list[str] | None = None
    platforms: list[str] | None = None
    system_requirements: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvSpec:
    """One environment, its features merged: what a solve needs."""

    name: str
    specs: list[str]
    channels: list[str]
    platforms: list[str]
    system_requirements: dict[str, str]

    def input_hash(self) -> str:
        """What the lock of this environment depends on; a change makes the lock stale."""
        data = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(data).hexdigest()

    @property
    def cuda(self) -> str | None:
        return self.system_requirements.get("cuda")

    @property
    def glibc(self) -> str:
        libc = self.system_requirements.get("libc", DEFAULT_GLIBC)
        return libc if isinstance(libc, str) else str(libc.get("version", DEFAULT_GLIBC))


@dataclass(frozen=True)
class Manifest:
    path: Path
    channels: list[str]
    platforms: list[str]
    features: dict[str, Feature]
    environments: dict[str, tuple[list[str], bool]]  # name → (features, include default)
    tool: dict

    def env_names(self) -> list[str]:
        names = list(self.environments)
        if DEFAULT_FEATURE not in names and self.features[DEFAULT_FEATURE].dependencies:
            names.insert(0, DEFAULT_FEATURE)
        return names

    def env(self, name: str) -> EnvSpec:
        if name == DEFAULT_FEATURE and name not in self.environments:
            feature_names = [DEFAULT_FEATURE]
        elif name in self.environments:
            feats, with_default = self.environments[name]
            feature_names = ([DEFAULT_FEATURE] if with_default else []) + feats
        else:
            raise ExtforgeError(
                f"environment {name!r} is not in {self.path}",
                f"the manifest defines: {', '.join(self.env_names())}",
                "pass one of those names",
            )
        missing = [f for f in feature_names if f not in self.features]
        if missing:
            raise ExtforgeError(f"environment {name!r} uses undefined features {missing}", "", f"define [feature.{missing[0]}] in {self.path}")
        features = [self.features[f] for f in feature_names]
        deps: dict[str, str | dict] = {}
        channels: list[str] = []
        sysreq: dict[str, str] = {}
        platforms = self.platforms
        for f in features:
            deps.update(f.dependencies)
            sysreq.update(f.system_requirements)
            channels += [c for c in f.channels or [] if c not in channels]
            platforms = f.platforms or platforms
        # Feature channels come first: pixi gives them priority over the workspace's.
        channels += [c for c in self.channels if c not in channels]
        return EnvSpec(name, [spec_string(n, v) for n, v in deps.items()], channels, list(platforms), sysreq)


def spec_string(name: str, value: str | dict) -> str:
    """A pixi dependency entry as a conda MatchSpec string."""
    if isinstance(value, str):
        return name if value.strip() in ("", "*") else f"{name} {value.strip()}"
    version = str(value.get("version", "*")).strip()
    build = value.get("build")
    spec = f"{name} {version}" if version != "*" or build else name
    return f"{spec} {build}" if build else spec


def _feature(table: dict) -> Feature:
    return Feature(
        dependencies=dict(table.get("dependencies", {})),
        channels=[c if isinstance(c, str) else c["channel"] for c in table["channels"]] if "channels" in table else None,
        platforms=table.get("platforms"),
        system_requirements=dict(table.get("system-requirements", {})),
    )


def parse_manifest(text: str, path: Path) -> Manifest:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExtforgeError(f"{path} is not valid TOML", str(exc), "fix the syntax error at the position shown") from exc
    ws = data.get("workspace") or data.get("project")
    if not ws:
        raise ExtforgeError(f"{path} has no [workspace] table", "pixi manifests declare channels and platforms there", "add [workspace] with channels and platforms")
    features = {DEFAULT_FEATURE: _feature(data)}
    for name, table in data.get("feature", {}).items():
        features[name] = _feature(table)
    envs: dict[str, tuple[list[str], bool]] = {}
    for name, value in data.get("environments", {}).items():
        if isinstance(value, list):
            envs[name] = (value, True)
        else:
            envs[name] = (list(value.get("features", [])), not value.get("no-default-feature", False))
    return Manifest(
        path=path,
        channels=[c if isinstance(c, str) else c["channel"] for c in ws.get("channels", [])],
        platforms=list(ws.get("platforms", [])),
        features=features,
        environments=envs,
        tool=data.get("tool", {}).get("extforge", {}),
    )


def read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise ExtforgeError(f"manifest {path} not found", "", "run from the repository root or pass --manifest PATH")
    return parse_manifest(path.read_text(), path.resolve())


def parse_channel_map(items: list[str]) -> dict[str, str]:
    """NAME=URL pairs (from --channel-map, EXTFORGE_CHANNEL_MAP or [tool.extforge.channel-map])."""
    out = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ExtforgeError(f"bad channel mapping {item!r}", "expected NAME=URL", "e.g. --channel-map conda-forge=http://127.0.0.1:8000/mirror")
        out[name.strip()] = url.strip()
    return out


def resolve_channel(channel: str, mapping: dict[str, str], base: Path) -> str:
    """The URL a channel of the manifest is fetched from here.

    A mapped channel wins; a local path becomes an absolute file:// URL (pixi.lock refuses
    relative ones); a bare name is a channel on conda.anaconda.org, as in pixi.
    """
    channel = mapping.get(channel, channel)
    if urlparse(channel).scheme in ("http", "https", "file"):
        return channel.rstrip("/")
    if channel.startswith((".", "/", "~")):
        return (base / Path(channel).expanduser()).resolve().as_uri()
    return f"https://conda.anaconda.org/{channel}"
