"""`extforge lock`: solve every environment of pixi.toml with rattler and write pixi.lock,
plus per environment an @EXPLICIT list, an environment.yml and a conda-lock.yml under envs/;
an environment with [pypi-dependencies] also gets pylock.<env>.toml beside pixi.lock (pylock.py).

The lock names the manifest's channels, as pixi's does: repodata and packages are fetched
through the site's mirrors (mirrors.py), and every URL is written back under the channel it
mirrors, so `pixi install --locked` accepts the lock and another site installs it through its
own mirror. Virtual packages come from the platforms of the manifest (not from this machine),
so a CPU login node locks for GPU nodes. Staleness: pixi.lock cannot carry extra keys, so the
hash of each environment's inputs (specs, channels, platforms) and the sha256 of the written
pixi.lock go to envs/lock-inputs.json; `--check` recomputes and compares them. Mirrors are not
an input: the same manifest locked through a mirror or at the real conda-forge is the same
request.

As pixi does, `--env a` re-solves a and keeps every other environment of the existing
pixi.lock (and its entry in lock-inputs.json). Lock runs on one workspace serialize on a lock
file beside pixi.lock, and every file is written through safe_files: unique temporaries
renamed over the final name, so a symlink planted in the workspace or envs/ is replaced,
never written through.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import channel_ref
from ..errors import EXIT_FINDINGS, ExtforgeError
from ..hashing import sha256_file
from ..locking import exclusive
from ..safe_files import make_dir, make_dirs, write_atomic
from .manifest import EnvSpec, Manifest, Platform
from .mirrors import Mirrors, canonical_channel

if TYPE_CHECKING:
    from rattler import LockFile
    from rattler.lock import Environment

INPUTS_NAME = "lock-inputs.json"


@dataclass
class LockResult:
    lock_path: Path
    environments: dict[str, int] = field(default_factory=dict)  # name → package count
    pypi: dict[str, int] = field(default_factory=dict)  # name → wheels in its pylock.toml(s)
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "lock": str(self.lock_path),
            "environments": self.environments,
            "pypi": self.pypi,
            "files": [str(f) for f in self.files],
            "seconds": round(self.seconds, 3),
        }


def envs_dir_for(lock_path: Path) -> Path:
    return lock_path.parent / "envs"


def virtual_packages(platform: Platform) -> list:
    """The virtual packages of the target nodes, as the manifest's platform declares them."""
    return channel_ref.virtual_packages(platform.subdir, linux=platform.linux, glibc=platform.glibc,
                                        extra=platform.virtual)


async def _solve(env: EnvSpec, channels: list[str], served: list[str], platform: Platform) -> list:
    from rattler import Subdir, solve

    if not env.specs:
        return []
    try:
        return await solve(
            served,
            env.specs,
            platforms=[Subdir(platform.subdir), Subdir("noarch")],
            virtual_packages=virtual_packages(platform),
        )
    except Exception as exc:  # rattler's SolverError / FetchRepoDataError
        where = ", ".join(c if c == s else f"{c} (through {s})" for c, s in zip(channels, served))
        why = (f"{exc}\n  specs: {', '.join(env.specs)}\n  channels: {where}"
               f"\n  virtual packages: {', '.join(f'{k}={v}' for k, v in sorted(platform.virtual.items())) or 'defaults'}")
        raise (await _node_refusal(env, served, platform, why) or await _missing_torch(env, served, platform, why) or ExtforgeError(
            f"cannot solve environment {env.name!r} for {platform.name}",
            why,
            "check that the channels are reachable: set the site's mirrors in pixi's config.toml ([mirrors]) "
            "or map them with --channel-map NAME=URL, and that they hold packages matching these specs",
        )) from exc


# What a solve assumes of nodes to find out whether theirs were the reason it failed: a glibc and
# a CUDA driver newer than any package's floor.
NODE_FACTS = {"__glibc": "2.999", "__cuda": "999"}


@dataclass(frozen=True)
class Shortfall:
    """A package's requirement on the nodes (`__glibc >=2.32,<3.0.a0`) that a platform does not meet."""

    package: str  # "demo-ext 0.1.0"
    requirement: str
    fact: str  # "__glibc" or "__cuda"
    have: str | None  # the platform's version; None: it declares none

    @property
    def floor(self) -> str:
        found = re.search(r">=\s*([\d.]+)", self.requirement)
        return found[1] if found else self.requirement.partition(" ")[2]

    def describe(self) -> str:
        what = f"glibc >= {self.floor}" if self.fact == "__glibc" else f"a driver for CUDA >= {self.floor}"
        has = "the platform declares none" if self.have is None else f"the platform's nodes have {self.have}"
        return f"{self.package} needs {what} ({self.requirement}; {has})"


async def _lifted_solve(specs: list[str], served: list[str], platform: Platform) -> list | None:
    """The solution for nodes with any glibc and CUDA driver; None where there is none either."""
    from rattler import Subdir, solve

    lifted = Platform(platform.name, platform.subdir, platform.virtual | NODE_FACTS)
    try:
        return await solve(served, specs, platforms=[Subdir(platform.subdir), Subdir("noarch")],
                           virtual_packages=virtual_packages(lifted))
    except Exception:  # rattler's SolverError: not (only) the nodes
        return None


def shortfalls(records: list, platform: Platform) -> list[Shortfall]:
    """Every `__glibc`/`__cuda` requirement of `records` (rattler records) the platform's nodes do not meet."""
    from rattler import MatchSpec, Version, VersionSpec

    have = {"__glibc": platform.glibc, "__cuda": platform.cuda}
    out = []
    for r in records:
        for dep in r.depends:
            spec = MatchSpec(dep)
            fact = spec.name.normalized
            if fact not in NODE_FACTS:
                continue
            version = have[fact]
            if version is None or (spec.version is not None and not VersionSpec(str(spec.version)).matches(Version(version))):
                out.append(Shortfall(f"{r.name.normalized} {r.version}", dep, fact, version))
    return out


def _node_fix(short: list[Shortfall]) -> str:
    """How to lock anyway, for the shortfalls of one virtual package."""
    top = max((s.floor for s in short), key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    first, key = short[0], "glibc" if short[0].fact == "__glibc" else "cuda"
    names = ", ".join(dict.fromkeys(n for s in short if (n := s.package.split()[0]) != "pytorch")) or "the extensions"
    line = f'{key} = "{top}" on the platform line of the manifest'
    if first.have is None:
        tool = "ldd --version" if key == "glibc" else "nvidia-smi"
        return f"declare the nodes' {'glibc' if key == 'glibc' else 'CUDA driver'} ({line}; `{tool}` on a node prints it)"
    if key == "glibc":
        return f"lock for nodes with glibc {top} or newer ({line}), or rebuild {names} on an older sysroot " \
               f"(a build machine or container with glibc {first.have})"
    return f"lock for nodes whose driver runs CUDA {top} ({line}), or build for CUDA {first.have.split('.')[0]}: " \
           f"a torch built for it in the mirror channel (`extforge mirror`) and {names} rebuilt against it"


async def _node_refusal(env: EnvSpec, served: list[str], platform: Platform, why: str) -> ExtforgeError | None:
    """A failed solve explained by the nodes' glibc or CUDA driver: solved again for nodes with any,
    the packages of that solution the platform's nodes could not run, each with its floor (for an
    extension, the one its audit measured: `extforge build` writes it into its run requirements)."""
    records = await _lifted_solve(env.specs, served, platform)
    short = shortfalls(records, platform) if records else []
    if not short:
        return None
    facts = dict.fromkeys(s.fact for s in short)
    return ExtforgeError(
        f"cannot lock environment {env.name!r} for {platform.name}: {'; '.join(s.describe() for s in short)}",
        why, "; and ".join(_node_fix([s for s in short if s.fact == f]) for f in facts))


async def _missing_torch(env: EnvSpec, served: list[str], platform: Platform, why: str) -> ExtforgeError | None:
    """A failed solve whose pytorch the channels do not hold (for any node): the `extforge mirror`
    command that adds that torch build."""
    from rattler import MatchSpec

    from .. import engine
    from ..recipes.variants import channel_files, channel_rows, describe_row, mirror_command

    torches = [s for s in env.specs if MatchSpec(s).name.normalized == "pytorch"]
    if not torches or await _lifted_solve(torches, served, platform) is not None:
        return None
    # A pinned version (==2.9.1, 2.9.*) is pip's too; a range leaves the version to the admin.
    pin = re.fullmatch(r"(?:==)?\s*([\d.*]+)", str(MatchSpec(torches[0]).version or ""))
    pythons = [m[1] for s in env.specs if MatchSpec(s).name.normalized == "python"
               and (m := re.search(r"(\d+\.\d+)", str(MatchSpec(s).version or "")))]
    found = channel_files(served)
    rows = channel_rows(*engine.read_variant_files(found)) if found else []
    like = next((r for r in rows if r.get("python") in pythons), rows[0] if rows else {})
    wanted = {"pytorch": pin[1] if pin else "VERSION"} | ({"python": pythons[0]} if pythons else {})
    held = (f"the mirror channel {found[0].parent} holds {'; '.join(f'({describe_row(r)})' for r in rows)}" if rows
            else "no channel of the environment was written by `extforge mirror` (no variants.yaml)")
    return ExtforgeError(
        f"cannot lock environment {env.name!r} for {platform.name}: no channel holds {torches[0]}",
        f"{held}\n  {why}",
        f"add that torch build to the mirror channel: {mirror_command(wanted, like, found[0].parent if found else None)}"
        "; or ask for a pytorch the channel has",
    )


def as_canonical(records: list, channels: list[str], served: list[str]) -> None:
    """Name each record by the manifest's channel it was fetched through, not the mirror."""
    pairs = [(c.rstrip("/"), s.rstrip("/")) for c, s in zip(channels, served)]
    for r in records:
        for canonical, mirror in pairs:
            if r.url.startswith(mirror + "/"):
                r.url = canonical + r.url[len(mirror):]
                r.channel = canonical + "/"
                break


def explicit_text(records: list, subdir: str) -> str:
    from .condalock import explicit_order, hex_digest

    # The platform line as `conda list --explicit` and conda-lock write it: readers check it
    # before they install a list made for another platform.
    lines = ["# generated by extforge lock; install with: conda create --name ENV --file THIS", f"# platform: {subdir}",
             "@EXPLICIT"]
    lines += [f"{r.url}#{hex_digest(r.md5)}" for r in explicit_order(records)]
    return "\n".join(lines) + "\n"


def environment_yml(name: str, channels: list[str], records: list) -> str:
    """Channels as the manifest names them (folders as file:// URLs): conda's channel_alias and
    custom_channels apply to names."""
    # An empty list is written `[]`: a bare `dependencies:` is null, which conda rejects.
    lines = ["# generated by extforge lock from pixi.lock", f"name: {name}", "channels:" + ("" if channels else " []")]
    lines += [f"  - {c}" for c in channels] + ["dependencies:" + ("" if records else " []")]
    lines += [f"  - {r.name.normalized}={r.version}={r.build}" for r in sorted(records, key=lambda r: r.name.normalized)]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    write_atomic(path, text.encode())


def run_lock_path(lock_path: Path) -> Path:
    """The lock file that serializes `extforge lock` runs on one workspace."""
    return lock_path.with_name(f".{lock_path.name}.extforge-lock")


def _kept_environments(lock_path: Path, manifest: Manifest, relocked: list[str]) -> list[tuple[str, Environment]]:
    """(name, rattler Environment) of the existing lock's environments that this run keeps:
    those the manifest still defines and this run does not re-solve."""
    from rattler import LockFile

    if not lock_path.is_file():
        return []
    try:
        old = LockFile.from_path(lock_path)
    except Exception as exc:  # rattler's parse errors
        raise ExtforgeError(
            f"cannot keep the other environments of {lock_path}: it is not a readable lock file",
            str(exc),
            "run `extforge lock` without --env to lock every environment again",
        ) from exc
    defined = set(manifest.env_names())
    return [(name, env) for name, env in old.environments() if name in defined and name not in relocked]


def _write_lock_file(lock_file: LockFile, lock_path: Path) -> None:
    """rattler writes only to a path: it writes into a private folder, we rename the bytes in."""
    with tempfile.TemporaryDirectory(prefix="extforge-lock-") as private:
        staged = Path(private) / lock_path.name
        lock_file.to_path(staged)
        write_atomic(lock_path, staged.read_bytes())


def _check_folder_channel(url: str, env: str) -> None:
    """A file:// channel must be a folder with repodata: said here, not by a solver error."""
    folder = channel_ref.local_folder(url) if url.startswith("file://") else None
    if folder is None:
        return
    if not (folder / "noarch" / "repodata.json").is_file():
        raise ExtforgeError(
            f"channel {url} of environment {env!r} is not a channel folder",
            f"{folder} does not exist" if not folder.exists() else f"{folder} has no noarch/repodata.json",
            "check the site's mirrors and --channel-map NAME=URL entries (a folder written by `extforge publish` or `extforge mirror`)",
        )


def lock(manifest: Manifest, lock_path: Path, mirrors: Mirrors | None = None, envs: list[str] | None = None) -> LockResult:
    make_dirs(lock_path.parent)
    with exclusive(run_lock_path(lock_path), transient=True):
        return _lock(manifest, lock_path, mirrors or Mirrors(), envs)


def _lock(manifest: Manifest, lock_path: Path, mirrors: Mirrors, envs: list[str] | None) -> LockResult:
    # Here, not at the top: `extforge install` checks the lock is current (stale_reasons) without them.
    from rattler import LockChannel, LockFile, LockPlatform

    from .condalock import conda_lock_document, conda_lock_text
    from .pylock import pylock_name, pylock_text, python_of, resolve

    start = time.monotonic()
    # An environment without dependencies is locked whatever was asked: it costs no solve, and
    # pixi writes it into every lock (`default`, even with an empty default feature).
    names = [*envs, *(n for n in manifest.env_names() if n not in envs and not manifest.env(n).specs)] if envs \
        else manifest.env_names()
    specs = [manifest.env(n) for n in names]
    kept = _kept_environments(lock_path, manifest, names) if envs else []
    kept_records = {name: old_env.conda_repodata_records() for name, old_env in kept}
    subdirs = sorted({p.subdir for e in specs for p in e.platforms} | {p for recs in kept_records.values() for p in recs})
    lock_file = LockFile([LockPlatform(p) for p in subdirs])
    result = LockResult(lock_path=lock_path)
    out_dir = envs_dir_for(lock_path)
    exports: dict[Path, str] = {}
    pylocks: dict[str, dict[str, str]] = {}  # environment → {pylock file name: its sha256}
    base = manifest.path.parent
    for name, old_env in kept:
        lock_file.set_channels(name, old_env.channels())
        for subdir, records in kept_records[name].items():
            for r in records:
                lock_file.add_conda_package(name, LockPlatform(subdir), r)
    for env in specs:
        channels = [canonical_channel(c, base) for c in env.channels]
        served = [mirrors.redirect(c) for c in channels]
        # An environment without dependencies (pixi's implicit `default`) reads no channel.
        for url in served if env.specs else []:
            _check_folder_channel(url, env.name)
        # pixi writes channel URLs with a trailing slash; its --locked check compares them.
        lock_file.set_channels(env.name, [LockChannel(c + "/") for c in channels])
        count = 0
        per_platform: dict[str, list] = {}
        for platform in env.platforms:
            records = asyncio.run(_solve(env, channels, served, platform))
            as_canonical(records, channels, served)
            for r in records:
                lock_file.add_conda_package(env.name, LockPlatform(platform.subdir), r)
            count += len(records)
            per_platform[platform.subdir] = records
            suffix = "" if len(env.platforms) == 1 else f".{platform.subdir}"
            exports[out_dir / f"{env.name}{suffix}.explicit.txt"] = explicit_text(records, platform.subdir)
            named = [canonical_channel(c, base) if c.startswith((".", "/", "~")) else c for c in env.channels]
            exports[out_dir / f"{env.name}{suffix}.environment.yml"] = environment_yml(env.name, named, records)
            if env.pypi:
                python = python_of(records, env.name)
                wheels = resolve(env, python, platform, base)
                text = pylock_text(env.name, python, platform, wheels, manifest.path.name)
                file_name = pylock_name(env.name, platform, len(env.platforms) > 1)
                exports[lock_path.parent / file_name] = text
                pylocks.setdefault(env.name, {})[file_name] = hashlib.sha256(text.encode()).hexdigest()
                result.pypi[env.name] = result.pypi.get(env.name, 0) + len(wheels)
        document = conda_lock_document(channels, per_platform, env.specs, manifest.path.name)
        exports[out_dir / f"{env.name}.conda-lock.yml"] = conda_lock_text(document)
        result.environments[env.name] = count
    make_dir(out_dir)
    _write_lock_file(lock_file, lock_path)
    for path, text in exports.items():
        _write(path, text)
    try:
        previous = json.loads((out_dir / INPUTS_NAME).read_text()) if kept else {}
        recorded, recorded_pylocks = dict(previous.get("environments", {})), dict(previous.get("pylocks", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        recorded, recorded_pylocks = {}, {}
    inputs = {
        "lock_sha256": sha256_file(lock_path),
        # A kept environment keeps the inputs it was locked from: if pixi.toml changed it since,
        # it stays stale, as it was.
        "environments": {name: recorded[name] for name, _ in kept if name in recorded} | {e.name: e.input_hash() for e in specs},
    }
    pylocks = {name: recorded_pylocks[name] for name, _ in kept if name in recorded_pylocks} | pylocks
    if pylocks:
        inputs["pylocks"] = pylocks
    _write(out_dir / INPUTS_NAME, json.dumps(inputs, indent=2, sort_keys=True) + "\n")
    result.files = [lock_path, *exports, out_dir / INPUTS_NAME]
    result.seconds = time.monotonic() - start
    return result


def stale_reasons(manifest: Manifest, lock_path: Path, envs: list[str] | None = None) -> list[str]:
    """Why pixi.lock no longer matches pixi.toml; empty when it is current."""
    if not lock_path.is_file():
        return [f"{lock_path} does not exist"]
    inputs_path = envs_dir_for(lock_path) / INPUTS_NAME
    try:
        inputs = json.loads(inputs_path.read_text())
    except (OSError, ValueError):
        return [f"{inputs_path} is missing or unreadable (lock not written by extforge lock)"]
    reasons = []
    if inputs.get("lock_sha256") != sha256_file(lock_path):
        reasons.append(f"{lock_path.name} was changed after extforge lock wrote it")
    for files in inputs.get("pylocks", {}).values():
        for name, sha in files.items():
            path = lock_path.parent / name
            if not path.is_file():
                reasons.append(f"{name} does not exist")
            elif sha256_file(path) != sha:
                reasons.append(f"{name} was changed after extforge lock wrote it")
    recorded = inputs.get("environments", {})
    for name in envs or manifest.env_names():
        if name not in recorded:
            reasons.append(f"environment {name!r} is not in the lock")
        elif recorded[name] != manifest.env(name).input_hash():
            reasons.append(f"environment {name!r} changed in {manifest.path.name} (dependencies, channels or platforms)")
    return reasons


def require_current(manifest: Manifest, lock_path: Path, envs: list[str] | None = None) -> None:
    reasons = stale_reasons(manifest, lock_path, envs)
    if reasons:
        raise ExtforgeError(
            f"{lock_path.name} is stale relative to {manifest.path.name}",
            "; ".join(reasons),
            "run `extforge lock` and commit pixi.lock and envs/",
            exit_code=EXIT_FINDINGS,
        )
