"""Read a pixi.toml (the subset extforge locks: channels, platforms with their virtual packages,
dependencies of features, environments) into plain data.

Platforms come in pixi's current form, each one a subdir with the virtual packages of the
machines it stands for:

    [workspace]
    platforms = [{ platform = "linux-64", cuda = "13.0", glibc = "2.28" }]

The deprecated `[system-requirements]` table (workspace or feature) is still read, folded into
every platform of the environments that use it the way pixi migrates it, and named in
`Manifest.deprecations` so that `extforge lock` can say so.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ExtforgeError
from ..publishing.names import SUBDIR, env_name_problem

DEFAULT_FEATURE = "default"
# pixi's defaults for linux platforms that do not say otherwise.
DEFAULT_GLIBC = "2.28"
DEFAULT_LINUX = "4.18"
# pixi's friendly platform keys and the virtual package each declares.
FRIENDLY_KEYS = {"cuda": "__cuda", "glibc": "__glibc", "linux": "__linux", "archspec": "__archspec", "macos": "__osx", "windows": "__win"}


@dataclass(frozen=True)
class Platform:
    """A named platform: a conda subdir plus the virtual packages its machines have."""

    name: str
    subdir: str
    virtual: dict[str, str] = field(default_factory=dict)  # "__cuda" → "13.0", ...

    @property
    def cuda(self) -> str | None:
        return self.virtual.get("__cuda")

    @property
    def glibc(self) -> str:
        return self.virtual.get("__glibc", DEFAULT_GLIBC)

    @property
    def linux(self) -> str:
        return self.virtual.get("__linux", DEFAULT_LINUX)

    def with_defaults(self, extra: dict[str, str]) -> Platform:
        """This platform with virtual packages of a [system-requirements] table under its own."""
        return Platform(self.name, self.subdir, extra | self.virtual) if extra else self


@dataclass(frozen=True)
class PypiOptions:
    """pixi's [pypi-options]: where the PyPI dependencies come from."""

    index_url: str | None = None  # None: PyPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()  # folders or URLs of flat wheel listings

    def merged(self, other: PypiOptions, where: str) -> PypiOptions:
        """A feature's options over the workspace's, as pixi merges them: one index-url, the extra
        indexes and find-links of both."""
        if self.index_url and other.index_url and self.index_url != other.index_url:
            raise ExtforgeError(f"two index-url values meet in {where}: {self.index_url} and {other.index_url}",
                                "pixi allows one primary index per environment",
                                "set index-url in one [pypi-options] table and list the others as extra-index-urls")
        return PypiOptions(self.index_url or other.index_url,
                           tuple(dict.fromkeys(self.extra_index_urls + other.extra_index_urls)),
                           tuple(dict.fromkeys(self.find_links + other.find_links)))


@dataclass(frozen=True)
class Feature:
    dependencies: dict[str, str | dict] = field(default_factory=dict)
    channels: list[str] | None = None
    platforms: list[str] | None = None  # platform names
    system_requirements: dict[str, str] = field(default_factory=dict)  # as virtual packages
    pypi_dependencies: dict[str, str] = field(default_factory=dict)  # name -> PEP 508 requirement
    pypi_options: PypiOptions = PypiOptions()


@dataclass(frozen=True)
class EnvSpec:
    """One environment, its features merged: what a solve needs."""

    name: str
    specs: list[str]
    channels: list[str]
    platforms: list[Platform]
    # [pypi-dependencies] as PEP 508 requirements: locked into pylock.<name>.toml (pylock.py)
    pypi: list[str] = field(default_factory=list)
    pypi_options: PypiOptions = PypiOptions()

    def input_hash(self) -> str:
        """What the lock of this environment depends on; a change makes the lock stale."""
        data = asdict(self)
        if not self.pypi:  # a conda-only environment hashes as before PyPI dependencies were read
            del data["pypi"], data["pypi_options"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    path: Path
    channels: list[str]
    platforms: dict[str, Platform]  # by name, in the manifest's order
    features: dict[str, Feature]
    environments: dict[str, tuple[list[str], bool]]  # name → (features, include default)
    tool: dict
    deprecations: list[str] = field(default_factory=list)
    pypi_options: PypiOptions = PypiOptions()  # the workspace's [pypi-options]

    def env_names(self) -> list[str]:
        """Every environment pixi writes into pixi.lock: `default` always (pixi adds it, the default
        feature alone, even when that feature is empty; a lock reader may expect it), then the
        manifest's own."""
        names = list(self.environments)
        if DEFAULT_FEATURE not in names:
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
        pypi: dict[str, str] = {}
        options = PypiOptions()
        channels: list[str] = []
        sysreq: dict[str, str] = {}
        platform_names = list(self.platforms)
        for f in features:
            deps.update(f.dependencies)
            pypi.update(f.pypi_dependencies)
            options = options.merged(f.pypi_options, f"environment {name!r}")
            sysreq.update(f.system_requirements)
            channels += [c for c in f.channels or [] if c not in channels]
            platform_names = f.platforms or platform_names
        # Feature channels come first: pixi gives them priority over the workspace's.
        channels += [c for c in self.channels if c not in channels]
        unknown = [p for p in platform_names if p not in self.platforms]
        if unknown:
            raise ExtforgeError(
                f"environment {name!r} uses platforms {unknown} that [workspace] platforms does not define",
                f"it defines: {', '.join(self.platforms)}",
                "add them to [workspace] platforms, e.g. { name = \"linux-64-cuda\", platform = \"linux-64\", cuda = \"13.0\" }",
            )
        platforms = [self.platforms[p].with_defaults(sysreq) for p in platform_names]
        options = self.pypi_options.merged(options, f"environment {name!r}") if pypi else PypiOptions()
        return EnvSpec(name, [spec_string(n, v) for n, v in deps.items()], channels, platforms, list(pypi.values()), options)


def spec_string(name: str, value: str | dict) -> str:
    """A pixi dependency entry as a conda MatchSpec string."""
    if isinstance(value, str):
        return name if value.strip() in ("", "*") else f"{name} {value.strip()}"
    version = str(value.get("version", "*")).strip()
    build = value.get("build")
    spec = f"{name} {version}" if version != "*" or build else name
    return f"{spec} {build}" if build else spec


def _virtual_from_sysreq(table: dict, where: str) -> dict[str, str]:
    """[system-requirements] as virtual packages (pixi's migration of the deprecated table)."""
    out = {}
    for key, value in table.items():
        if key == "libc":
            version = value if isinstance(value, str) else value.get("version", DEFAULT_GLIBC)
            out["__glibc"] = str(version)
        elif key in FRIENDLY_KEYS:
            out[FRIENDLY_KEYS[key]] = str(value)
        else:
            raise ExtforgeError(f"unknown key {key!r} in {where}", "pixi knows cuda, libc, linux, archspec, macos", "remove it")
    return out


def _known_subdir(subdir: str, path: Path) -> None:
    from rattler import Platform as Subdir

    known = [str(p) for p in Subdir.all()]
    if not SUBDIR.fullmatch(subdir) or subdir not in known:
        raise ExtforgeError(f"platform {subdir!r} in {path} is not a conda subdir", f"conda knows {', '.join(known)}",
                            'write e.g. "linux-64" or { platform = "linux-64", cuda = "13.0" }')


def _platform(entry: str | dict, path: Path) -> Platform:
    if isinstance(entry, str):
        _known_subdir(entry, path)
        return Platform(entry, entry)
    if "platform" not in entry:
        raise ExtforgeError(f"a platform in {path} has no `platform` key", str(entry), 'write { platform = "linux-64", cuda = "13.0" }')
    _known_subdir(str(entry["platform"]), path)
    virtual = {}
    for key, value in entry.items():
        if key in ("name", "platform"):
            continue
        if key == "cuda" and isinstance(value, dict):
            # pixi's { driver, arch } form: the driver's CUDA and the GPU's compute capability.
            virtual["__cuda"] = str(value["driver"])
            if "arch" in value:
                virtual["__cuda_arch"] = str(value["arch"])
        elif key in FRIENDLY_KEYS:
            virtual[FRIENDLY_KEYS[key]] = str(value)
        elif key.startswith("__"):
            virtual[key] = str(value)
        else:
            raise ExtforgeError(
                f"unknown key {key!r} on platform {entry['platform']!r} in {path}",
                f"pixi knows name, platform, {', '.join(FRIENDLY_KEYS)} and raw __name keys",
                "remove or rename it",
            )
    return Platform(str(entry.get("name", entry["platform"])), str(entry["platform"]), virtual)


def pypi_requirement(name: str, value: object, where: str) -> str:
    """A [pypi-dependencies] entry as a PEP 508 requirement: a version specifier string, or
    pixi's table with `version` and `extras`. Sources that are no index (path, url, git) give
    no wheel a lock can pin by hash and are refused."""
    from packaging.requirements import InvalidRequirement, Requirement

    if isinstance(value, dict):
        unknown = sorted(set(value) - {"version", "extras"})
        if unknown:
            raise ExtforgeError(
                f"[{where}] {name} = {{ {unknown[0]} = ... }} is not locked by extforge",
                "extforge locks wheels from the workspace's indexes ([pypi-options] index-url, extra-index-urls, "
                "find-links), each pinned by its sha256; a path, url, git or per-package index source is none of those",
                "publish the wheel to the site's wheel index and depend on it by version",
            )
        extras = value.get("extras", [])
        version = str(value.get("version", "*"))
        text = f"{name}[{','.join(map(str, extras))}]" if extras else name
    else:
        text, version = name, str(value)
    version = version.strip()
    text += "" if version in ("", "*") else version
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise ExtforgeError(f"[{where}] {name} = {value!r} is not a PyPI requirement", str(exc),
                            'write a version specifier such as "==2.8.3" or ">=1.0,<2", or "*"') from exc
    return text


def _pypi_options(table: dict, where: str) -> PypiOptions:
    known = {"index-url", "extra-index-urls", "find-links", "no-build", "index-strategy"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ExtforgeError(f"unknown key {unknown[0]!r} in [{where}]", f"extforge reads {', '.join(sorted(known))}",
                            "remove it")
    links = []
    for entry in table.get("find-links", []):
        link = entry.get("path") or entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(link, str):
            raise ExtforgeError(f"a find-links entry of [{where}] is not {{ path = ... }} or {{ url = ... }}", str(entry),
                                'write find-links = [{ path = "/nfs/wheels" }]')
        links.append(link)
    return PypiOptions(table.get("index-url"), tuple(table.get("extra-index-urls", [])), tuple(links))


def _feature(table: dict, prefix: str) -> Feature:
    """A feature's tables; prefix: "" for the workspace's own, "feature.NAME." for a feature."""
    return Feature(
        dependencies=dict(table.get("dependencies", {})),
        pypi_dependencies={n: pypi_requirement(n, v, f"{prefix}pypi-dependencies")
                           for n, v in table.get("pypi-dependencies", {}).items()},
        pypi_options=_pypi_options(table.get("pypi-options", {}), f"{prefix}pypi-options"),
        channels=[c if isinstance(c, str) else c["channel"] for c in table["channels"]] if "channels" in table else None,
        platforms=[p if isinstance(p, str) else p.get("name", p.get("platform")) for p in table["platforms"]] if "platforms" in table else None,
        system_requirements=_virtual_from_sysreq(table.get("system-requirements", {}), f"[{prefix}system-requirements]"),
    )


def parse_manifest(text: str, path: Path) -> Manifest:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExtforgeError(f"{path} is not valid TOML", str(exc), "fix the syntax error at the position shown") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ExtforgeError(f"{path} nests arrays or tables too deeply to read", "no pixi manifest nests more than a few levels",
                            "remove the deeply nested value") from None
    ws = data.get("workspace") or data.get("project")
    if not ws:
        raise ExtforgeError(f"{path} has no [workspace] table", "pixi manifests declare channels and platforms there", "add [workspace] with channels and platforms")
    features = {DEFAULT_FEATURE: _feature(data, "")}
    deprecations = []
    if "system-requirements" in data:
        deprecations.append("[system-requirements]")
    for name, table in data.get("feature", {}).items():
        features[name] = _feature(table, f"feature.{name}.")
        if "system-requirements" in table:
            deprecations.append(f"[feature.{name}.system-requirements]")
    envs: dict[str, tuple[list[str], bool]] = {}
    for name, value in data.get("environments", {}).items():
        problem = env_name_problem(name)
        if problem:
            # The name becomes envs/<name>.* file names: `../x` or `/x` would be written outside envs/.
            raise ExtforgeError(f"{problem} in {path}", "environment names become file names under envs/",
                                "rename it in [environments], e.g. `cuda-13`")
        if isinstance(value, list):
            envs[name] = (value, True)
        else:
            envs[name] = (list(value.get("features", [])), not value.get("no-default-feature", False))
    platforms = [_platform(p, path) for p in ws.get("platforms", [])]
    return Manifest(
        path=path,
        channels=[c if isinstance(c, str) else c["channel"] for c in ws.get("channels", [])],
        platforms={p.name: p for p in platforms},
        features=features,
        environments=envs,
        tool=data.get("tool", {}).get("extforge", {}),
        pypi_options=_pypi_options(data.get("pypi-options", {}), "pypi-options"),
        deprecations=[
            f"{path.name}: {table} is deprecated in pixi (since 0.71); declare the virtual packages on the "
            'platform instead: [workspace] platforms = [{ platform = "linux-64", cuda = "13.0", glibc = "2.28" }]'
            for table in deprecations
        ],
    )


def read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise ExtforgeError(f"manifest {path} not found", "", "run from the repository root or pass --manifest PATH")
    return parse_manifest(path.read_text(), path.resolve())
