"""pylock.toml (PEP 751) for the PyPI part of an environment: the wheels pip and uv users install.

An environment of pixi.toml that lists `[pypi-dependencies]` (pixi's own table, with its
`[pypi-options]` for the indexes) is locked twice by `extforge lock`: its conda packages into
pixi.lock, as before, and its PyPI packages into `pylock.<env>.toml` beside it. As pixi does,
the PyPI packages are resolved for the Python of the environment's conda packages (the solved
`python` record) and for the manifest's platform (its glibc gives the manylinux floor), not for
the machine that locks.

uv resolves (`uv pip compile --format pylock.toml`; pip evaluates environment markers for the
interpreter it runs on, whatever `--python-version` says). Its answer is read as data and the
lock is written here: wheels only (an sdist would be built on the node, by whatever compiler is
there), each with its URL, size and sha256, narrowed to the wheels the target can install, and
`environments` / `requires-python` naming the one platform and Python it was resolved for, so
pip and uv refuse to install it anywhere else. Neither uv's nor pip's configuration files or
environment take part: the indexes are the manifest's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from ..errors import ExtforgeError
from .manifest import EnvSpec, Platform

CREATED_BY = "extforge"
LOCK_VERSION = "1.0"
# The conda subdirs whose wheels have a manylinux platform tag, and that tag's machine name.
MACHINES = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "linux-ppc64le": "ppc64le", "linux-s390x": "s390x"}
# PEP 600's legacy aliases: manylinux1 is glibc 2.5, manylinux2010 2.12, manylinux2014 2.17.
_LEGACY = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
# uv settings that change no answer (where the cache lives, how it talks to servers); every
# other UV_* variable (UV_INDEX_URL, UV_CONSTRAINT, ...) would change what the lock holds.
_UV_KEEP = {"UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES", "UV_INSECURE_HOST", "UV_OFFLINE"}


@dataclass(frozen=True)
class LockedWheel:
    """One package of a pylock.toml: the one wheel the target installs."""

    name: str  # normalized
    version: str
    file_name: str
    url: str
    sha256: str
    size: int | None = None
    requires_python: str | None = None
    index: str | None = None


@dataclass(frozen=True)
class PyLock:
    """A pylock.toml as extforge reads it back (verify): its packages by normalized name."""

    path: Path
    packages: dict[str, LockedWheel]
    environments: tuple[str, ...]


def pylock_name(env: str, platform: Platform, several: bool) -> str:
    """pylock.<env>.toml (PEP 751's rule: the name has no dots), per subdir where an environment
    has several platforms."""
    return f"pylock.{env}-{platform.subdir}.toml" if several else f"pylock.{env}.toml"


def python_of(records: Iterable, env: str) -> str:
    """The version of the environment's conda `python` record: what its PyPI packages are for."""
    for r in records:
        if r.name.normalized == "python":
            return str(r.version)
    raise ExtforgeError(
        f"environment {env!r} has [pypi-dependencies] but no python among its conda packages",
        "PyPI packages are resolved for the environment's Python; pixi requires python in [dependencies] too",
        'add python to the environment\'s [dependencies], e.g. python = "3.12.*"',
    )


def machine(platform: Platform) -> str:
    arch = MACHINES.get(platform.subdir)
    if arch is None:
        raise ExtforgeError(f"cannot lock PyPI packages for platform {platform.subdir}",
                            f"extforge locks wheels for Linux platforms: {', '.join(MACHINES)}",
                            "lock the PyPI dependencies of this platform with pixi, or drop them from its environment")
    return arch


def platform_tags(platform: Platform) -> list[str]:
    """The platform tags a node of this platform installs, in pip's order of preference:
    manylinux_2_N down from the platform's glibc (PEP 600, with the legacy aliases), then
    linux_<arch> (a wheel built at the site for its own nodes)."""
    arch = machine(platform)
    major, minor = (int(x) for x in platform.glibc.split(".")[:2])
    tags = []
    for m in range(minor, 4, -1):
        tags.append(f"manylinux_{major}_{m}_{arch}")
        if (major, m) in _LEGACY:
            tags.append(f"{_LEGACY[major, m]}_{arch}")
    return [*tags, f"linux_{arch}"]


def target_tags(python: str, platform: Platform) -> list[Tag]:
    """Every tag CPython `python` installs on the platform, most preferred first."""
    version = tuple(int(x) for x in python.split(".")[:2])
    plats = platform_tags(platform)
    return [*cpython_tags(version, platforms=plats), *compatible_tags(version, f"cp{version[0]}{version[1]}", plats)]


def environment_marker(python: str, platform: Platform) -> str:
    short = ".".join(python.split(".")[:2])
    return (f"sys_platform == 'linux' and platform_machine == '{machine(platform)}' and "
            f"implementation_name == 'cpython' and python_version == '{short}'")


def _local_path(url: str) -> Path | None:
    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def uv_command(env: EnvSpec, python: str, platform: Platform, base: Path) -> list[str]:
    import uv

    options = env.pypi_options
    glibc = "_".join(platform.glibc.split(".")[:2])
    cmd = [uv.find_uv_bin(), "pip", "compile", "-", "--no-config", "--quiet", "--format", "pylock.toml",
           "--python-version", python, "--python-platform", f"{machine(platform)}-manylinux_{glibc}",
           "--only-binary", ":all:", "--no-header", "--no-annotate"]
    if options.index_url:
        cmd += ["--index-url", _located(options.index_url, base)]
    for url in options.extra_index_urls:
        cmd += ["--extra-index-url", _located(url, base)]
    for link in options.find_links:
        cmd += ["--find-links", _located(link, base)]
    return cmd


def _located(where: str, base: Path) -> str:
    """A relative folder of the manifest (pixi reads them relative to it) as an absolute path."""
    if "://" in where or os.path.isabs(where):
        return where
    return str((base / where).resolve())


def resolve(env: EnvSpec, python: str, platform: Platform, base: Path) -> list[LockedWheel]:
    """The wheels of env's PyPI dependencies for (python, platform), resolved by uv."""
    cmd = uv_command(env, python, platform, base)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _UV_KEEP}
    try:
        proc = subprocess.run(cmd, input="\n".join(env.pypi) + "\n", capture_output=True, text=True, env=clean,
                              timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExtforgeError(f"cannot run uv to resolve the PyPI packages of {env.name!r}", str(exc),
                            "reinstall extforge (uv is one of its dependencies)") from exc
    if proc.returncode != 0:
        indexes = [x for x in (env.pypi_options.index_url or "https://pypi.org/simple",
                               *env.pypi_options.extra_index_urls, *env.pypi_options.find_links)]
        raise ExtforgeError(
            f"cannot resolve the PyPI packages of environment {env.name!r} for Python {python} on {platform.name}",
            f"{proc.stderr.strip()}\n  requirements: {', '.join(env.pypi)}\n  indexes: {', '.join(indexes)}",
            "check the indexes in [pypi-options] (index-url, extra-index-urls, find-links) and that they hold "
            "wheels for this Python and platform",
        )
    try:
        document = tomllib.loads(proc.stdout)
    except tomllib.TOMLDecodeError as exc:
        raise ExtforgeError("uv's resolution is not a pylock.toml", str(exc), "report this with uv's version") from exc
    return wheels_for(document, target_tags(python, platform))


def wheels_for(document: dict, tags: list[Tag]) -> list[LockedWheel]:
    """Each package of a resolver's pylock.toml, with the best of its wheels the target installs."""
    rank = {t: i for i, t in reversed(list(enumerate(tags)))}
    locked = []
    for package in document.get("packages", []):
        name = canonicalize_name(str(package["name"]))
        candidates = []
        for wheel in package.get("wheels", []):
            url = str(wheel.get("url") or Path(str(wheel["path"])).absolute().as_uri())
            file_name = str(wheel.get("name") or unquote(url.rsplit("/", 1)[-1]))
            try:
                _n, _v, _b, wheel_tags = parse_wheel_filename(file_name)
            except InvalidWheelFilename:
                continue
            fits = [rank[t] for t in wheel_tags if t in rank]
            if not fits:
                continue
            size = wheel.get("size")
            local = _local_path(url)
            if size is None and local is not None and local.is_file():
                size = local.stat().st_size
            sha256 = wheel.get("hashes", {}).get("sha256")
            if not sha256:
                raise ExtforgeError(f"the index gives no sha256 for {file_name}",
                                    "a lock pins every wheel by its sha256; the resolver got none from the index",
                                    "serve the index with sha256 in every link (PEP 503 `#sha256=`)")
            candidates.append((min(fits), LockedWheel(
                name, str(package["version"]), file_name, url, str(sha256), int(size) if size is not None else None,
                package.get("requires-python"), package.get("index"))))
        if not candidates:
            raise ExtforgeError(f"{name} {package.get('version')} has no wheel for this Python and platform",
                                "the lock holds wheels only: an sdist would be compiled on every node by its own compiler",
                                "publish a wheel of it for this torch row to the site's wheel index")
        locked.append(min(candidates, key=lambda c: c[0])[1])
    return sorted(locked, key=lambda w: w.name)


def _toml(value: str) -> str:
    # A JSON string is a TOML basic string: the same escapes (\" \\ \n \uXXXX).
    return json.dumps(value)


def pylock_text(env: str, python: str, platform: Platform, wheels: list[LockedWheel], manifest: str) -> str:
    """The lock in PEP 751's form, keys in the spec's order, packages sorted by name."""
    short = ".".join(python.split(".")[:2])
    lines = [
        f"# generated by extforge lock from {manifest} (environment {env}, {platform.name}); install with",
        "#   pip install -r THIS   or   uv pip sync THIS",
        f"lock-version = {_toml(LOCK_VERSION)}",
        f"environments = [{_toml(environment_marker(python, platform))}]",
        f"requires-python = {_toml('==' + short + '.*')}",
        "extras = []",
        "dependency-groups = []",
        "default-groups = []",
        f"created-by = {_toml(CREATED_BY)}",
    ]
    for w in wheels:
        lines += ["", "[[packages]]", f"name = {_toml(w.name)}", f"version = {_toml(w.version)}"]
        if w.requires_python:
            lines.append(f"requires-python = {_toml(w.requires_python)}")
        if w.index:
            lines.append(f"index = {_toml(w.index)}")
        size = f", size = {w.size}" if w.size is not None else ""
        lines += ["wheels = [",
                  f"  {{ name = {_toml(w.file_name)}, url = {_toml(w.url)}{size}, hashes = {{ sha256 = {_toml(w.sha256)} }} }},",
                  "]"]
    lines += ["", "[tool.extforge]", f"environment = {_toml(env)}", f"platform = {_toml(platform.name)}",
              f"python = {_toml(python)}", f"glibc = {_toml(platform.glibc)}"]
    return "\n".join(lines) + "\n"


def read_pylock(path: Path) -> PyLock:
    """A pylock.toml with wheels only (what extforge writes; another locker's too, where it pins
    one wheel per package)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ExtforgeError(f"cannot read {path}", str(exc), "pass the pylock.toml `extforge lock` wrote") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExtforgeError(f"{path} is not a TOML file", str(exc), "pass the pylock.toml `extforge lock` wrote") from exc
    if str(data.get("lock-version", "")).split(".")[0] != "1":
        raise ExtforgeError(f"{path} is not a PEP 751 lock of version 1", f"lock-version = {data.get('lock-version')!r}",
                            "pass a pylock.toml")
    packages: dict[str, LockedWheel] = {}
    for entry in data.get("packages", []):
        name = canonicalize_name(str(entry.get("name", "")))
        wheels = entry.get("wheels", [])
        if not name or len(wheels) != 1 or "version" not in entry:
            raise ExtforgeError(f"{path}: package {name or '?'} does not pin one wheel with a version",
                                "verify compares each installed distribution with the one wheel its lock names",
                                "lock the environment with `extforge lock`")
        wheel = wheels[0]
        where = wheel.get("url") or (path.parent / str(wheel.get("path", ""))).absolute().as_uri()
        sha = wheel.get("hashes", {}).get("sha256")
        if not isinstance(sha, str) or name in packages:
            raise ExtforgeError(f"{path}: package {name} " + ("is listed twice" if name in packages else "has no sha256"),
                                "verify needs exactly one wheel, pinned by sha256, per package", "lock it again")
        file_name = str(wheel.get("name") or unquote(str(where).rsplit("/", 1)[-1]))
        packages[name] = LockedWheel(name, str(entry["version"]), file_name, str(where), sha,
                                     wheel.get("size"), entry.get("requires-python"), entry.get("index"))
    return PyLock(path, packages, tuple(str(e) for e in data.get("environments", [])))
