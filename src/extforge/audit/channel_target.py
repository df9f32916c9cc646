"""The target environment of a package when none is given: the host environment its build
used (right after `extforge build`), or its pinned pytorch installed from a channel into a
cached prefix (solve + install with rattler, like pixi does)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .. import cache
from ..channel_ref import channel_url, records, virtual_packages
from ..errors import ExtforgeError
from ..locking import exclusive
from ..paths import cache_root, mark_used, own_area, rattler_pkgs_dir
from ..safe_files import make_dirs, remove_quietly, rename, write_atomic
from ..ui import log
from . import local_archives

if TYPE_CHECKING:
    from rattler import RepoDataRecord

T = TypeVar("T")

TORCH_NAMES = ("pytorch", "libtorch", "pytorch-gpu", "pytorch-cpu")
# In a target installed from archives checked against their sha256 (local_archives): one
# installed before may hold another channel's files under the sha256s its name hashes.
CHECKED = ".extforge-archives-checked"
# A build host has no __cuda; the package's pytorch run-depends on it.
DEFAULT_CUDA = "13.0"


def torch_specs(depends: list[str]) -> list[str]:
    """The package's run requirements on torch, e.g. ['pytorch ==2.14.1 cuda130_py311_h1480fd6_0']."""
    return [d for d in depends if d.split()[0] in TORCH_NAMES]


def build_env_mismatch(prefix: Path, depends: list[str]) -> str | None:
    """Why `prefix` (a build's host env) does not hold the torch the package pins; None if it does.

    Only then does an audit against the build's env also prove the package against the torch
    its users install."""
    from rattler import MatchSpec, PrefixRecord

    records = [PrefixRecord.from_path(p) for p in sorted((Path(prefix) / "conda-meta").glob("*.json"))]
    torches = [r for r in records if r.name.normalized in TORCH_NAMES]
    for spec in torch_specs(depends):
        if not any(MatchSpec(spec).matches(r) for r in torches):
            built = ", ".join(f"{r.name.normalized} {r.version} {r.build}" for r in torches) or "no pytorch"
            return f"the package pins `{spec}`, but its build compiled against {built}"
    return None


def _node_virtual_packages() -> list:
    """What a GPU node offers the solve (a build host has no __cuda; CONDA_OVERRIDE_CUDA names one)."""
    return virtual_packages("linux-64", linux="5.0", glibc="2.28",
                            extra={"__cuda": os.environ.get("CONDA_OVERRIDE_CUDA", DEFAULT_CUDA)})


def channel_torches(channels: Sequence[str]) -> list[dict]:
    """Every torch build the channels' linux-64 indexes hold, newest first (one entry per build)."""
    found: dict[tuple[str, str, str], dict] = {}
    for channel in channels:
        for record in records(channel, "linux-64").values():
            if record.get("name") in TORCH_NAMES:
                found.setdefault((record["name"], record["version"], record["build"]), record)
    from rattler import Version

    return sorted(found.values(), key=lambda r: (Version(r["version"]), r["build"]), reverse=True)


def exact_spec(record: dict) -> str:
    return f"{record['name']} =={record['version']} {record['build']}"


def admits(depends: list[str], torch: dict, channels: Sequence[str]) -> str | None:
    """Why the run requirements `depends` cannot be installed beside this torch build; None if they can.

    A real solve (the package's requirements plus that exact torch) against the channels, as a
    user's install would do it: a version bound, a CUDA build pattern or a python pin may each exclude it."""
    from rattler import solve

    specs = [d for d in depends if not d.startswith("__")] + [exact_spec(torch)]
    try:
        asyncio.run(solve([channel_url(c) for c in channels], specs, platforms=["linux-64", "noarch"],
                          virtual_packages=_node_virtual_packages()))
    except Exception as exc:  # rattler's SolverError: the message names the conflict
        return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return None


def pinned_torch_prefix(depends: list[str], channels: str | Sequence[str]) -> Path:
    """A cached prefix holding the package's pinned pytorch, solved from `channels` in order."""
    channels = [channel_url(c) for c in ([channels] if isinstance(channels, str) else channels)]
    specs = torch_specs(depends)
    if not specs:
        raise ExtforgeError(
            "the package does not depend on pytorch, so there is no pinned torch to audit against",
            f"its depends are: {', '.join(depends) or 'none'}",
            "pass --against PREFIX with the environment the package must run in",
        )
    # Solved before the lock (tens of ms on a local channel, from the index the install needs
    # anyway): the entry is named by what it installs, not by where that came from.
    solved = _run_rattler(_solve(specs, channels), specs, channels)
    # Before the target is looked up: its name takes the sha256 the indexes claim.
    claims = local_archives.claims_of(solved)
    local_archives.check(claims)
    prefix = own_area("audit-targets") / target_key(solved)
    # Parallel builds (Slurm jobs on a shared cache) audit against the same torch at once.
    with exclusive(prefix.with_name(prefix.name + ".lock")):
        if (prefix / CHECKED).is_file():
            mark_used(prefix)
            return prefix
        tmp = prefix.with_name(prefix.name + f".tmp{os.getpid()}")
        # Below the cache root nothing is followed: a link planted at audit-targets/ leads nowhere.
        make_dirs(tmp.parent, beneath=cache_root())
        # Under the lock no install of this target runs: a .tmp of its name is what a killed one
        # left (`cache --prune` passes .tmp folders by, as a running install's), and a target
        # without CHECKED was installed before its archives were checked.
        for left in [prefix, *tmp.parent.glob(f"{prefix.name}.tmp*")]:
            remove_quietly(left, beneath=cache_root())
        cache.make_room(cache_root(), f"installing {', '.join(specs)} to audit against")
        log.info("installing %d packages (%s) into the audit target %s", len(solved), ", ".join(specs), prefix)
        local_archives.vouch_entries(claims, rattler_pkgs_dir())
        try:
            _run_rattler(_install(solved, tmp), specs, channels)
        except ExtforgeError:
            remove_quietly(tmp, beneath=cache_root())
            raise
        local_archives.vouch_extracted(claims, rattler_pkgs_dir())
        write_atomic(tmp / CHECKED, b"", beneath=cache_root())
        rename(tmp, prefix, beneath=cache_root())
    return prefix


def target_key(solved: Sequence[RepoDataRecord]) -> str:
    """The name of the audit target that installs `solved`: the packages' sha256, so every channel
    that resolves the pin to the same files (each checkout's copy of a mirror channel, an admin's
    output folder beside the mirror it was built from) shares one ~5 GB target, and one whose torch
    differs by a build gets its own. A record whose index gives no sha256 counts by its URL."""
    ids = sorted(r.sha256.hex() if r.sha256 else r.url for r in solved)
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


async def _solve(specs: list[str], channels: list[str]) -> list[RepoDataRecord]:
    from rattler import solve

    return await solve(channels, specs, platforms=["linux-64", "noarch"], virtual_packages=_node_virtual_packages())


async def _install(solved: list[RepoDataRecord], prefix: Path) -> None:
    from rattler import install

    await install(solved, target_prefix=prefix, cache_dir=rattler_pkgs_dir(), show_progress=False)


def _run_rattler(step: Coroutine[Any, Any, T], specs: list[str], channels: list[str]) -> T:
    try:
        return asyncio.run(step)
    except Exception as exc:  # rattler's SolverError / FetchRepoDataError / InstallerError
        raise ExtforgeError(
            f"cannot install the package's pinned torch from {', '.join(channels)}",
            f"{exc}\n  specs: {', '.join(specs)}",
            "check that the channel holds that exact pytorch build, or pass --against PREFIX",
        ) from exc
