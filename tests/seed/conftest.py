"""The seed clusters: every (python, torch) row our users run, mirrored into ONE channel and
demo-ext built for each into ONE output channel, once per session and cached across sessions
(cold: ~3 GB of wheels per torch build, the cache grew 40.4 GiB for the four rows; warm: seconds).
The session's start begins that work in a background process (prepare.py) that the fixtures wait for.

Rows whose python is missing, or whose channel holds no CUDA toolkit of torch's major, are
skipped with that reason; the others are built and tested. A machine whose disk cannot hold
what the rows' cold parts will add (disk_need) skips them all and says how much is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge import cache, paths
from extforge.locking import exclusive
from extforge.machine import detect
from extforge.mirror.recipes import code_generation
from fixture_keys import build_key
from pythons import find_python

from . import prepare

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = REPO / "recipe" / "demo-ext"


@dataclass(frozen=True)
class Cluster:
    name: str
    python: str
    torch: str  # the pip requirement's version
    cuda: str  # torch.version.cuda of that pip build
    cxx11_abi: bool
    archs: str  # TORCH_CUDA_ARCH_LIST of its GPUs


CLUSTERS = [
    Cluster("A", "3.10", "2.9.1", "12.8", True, "8.0;9.0"),
    Cluster("B", "3.12", "2.9.1", "12.8", True, "8.9"),
    Cluster("C", "3.12", "2.6.0", "12.4", False, "8.9"),
    Cluster("CI", "3.11", "2.14.1", "13.0", True, "9.0"),
]


@dataclass
class SeedChannel:
    path: Path
    rows: dict[str, dict[str, str]]  # cluster name -> the channel's variant values of its row
    skipped: dict[str, str]  # cluster name -> why it is not in the channel
    seconds: dict[str, float]

    def row(self, cluster: Cluster) -> dict[str, str]:
        if cluster.name in self.skipped:
            pytest.skip(f"cluster {cluster.name}: {self.skipped[cluster.name]}")
        return self.rows[cluster.name]


# What the seed part adds to the disk, per part, measured from an empty cache on the 2-core machine
# with the seed tests alone (docs/benchmarks-history.md, "Cold test suite ... (2026-11-25, issue 27)"):
# free disk fell 48.9 GiB at the peak and the cache grew 48.8 GiB; the rows' wheels, mirror
# packages and channel (mirror/ + channels/) peaked at 23.5 GiB, the rest of the cache (extracted
# packages, demo-ext builds, the rows' envs) is the other 25.3 GiB; outside the cache the run held
# <0.1 GiB, so scratch is 1 GiB of margin. (In the whole suite the seed part adds less, ~27 GiB:
# the suite's earlier tests have already mirrored CI's row.)
MIRROR_GIB = 23.5
INSTALL_GIB = 25.3
SCRATCH_GIB = 1.0
# Written after every row was mirrored: the package files that make the next run warm.
WARM_RECORD = "seed-clusters-warm.json"


def _warm_record() -> Path:
    return paths.cache_root() / "test-fixtures" / WARM_RECORD


@dataclass(frozen=True)
class DiskNeed:
    """What the seed part will add to the disk from here, per part that is not warm yet."""

    parts: dict[str, float]  # part -> GiB

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{part} {gib:.1f} GiB" for part, gib in self.parts.items())


def _warm_packages(record: Path) -> list[Path]:
    """The package files the warm record lists; none where it is missing, unreadable or of
    another generation of the mirror's code (this code's keys name other packages: marking those
    in use would keep a dead generation from the room-making a cold run needs)."""
    try:
        data = json.loads(record.read_text())
        if data.get("generation") != code_generation():
            return []
        return [Path(f) for f in data["packages"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def disk_need(record: Path, extracted: Path, channel_made: bool = False) -> DiskNeed:
    """The parts still cold: the rows' mirror packages (all on disk: warm), and their pytorch
    packages extracted for builds and envs (rattler's folder per package: warm).
    `channel_made`: this session's background made the seed channel, so the mirror's work is
    done whatever the cache lost since (a package room-making removed is still in the channel)."""
    packages = _warm_packages(record)
    mirrored = channel_made or (bool(packages) and all(f.is_file() for f in packages))
    torches = [f for f in packages if f.name.startswith("pytorch-")]
    unpacked = mirrored and bool(torches) and all((extracted / f.name.removesuffix(".conda")).is_dir() for f in torches)
    parts = {"mirror": 0.0 if mirrored else MIRROR_GIB, "extracted packages, builds and envs": 0.0 if unpacked else INSTALL_GIB}
    return DiskNeed({k: v for k, v in parts.items() if v} | {"scratch": SCRATCH_GIB})


def disk_shortfall(free_bytes: int, need: DiskNeed) -> str | None:
    """Why this disk cannot take the seed rows from here, or None."""
    free = free_bytes / 2**30
    if free >= need.total:
        return None
    return (f"the seed rows need ~{need.total:.1f} GiB on the disk of {paths.cache_root()} ({need.describe()}) and "
            f"{free:.1f} GiB is free; free space or point EXTFORGE_CACHE at a bigger disk")


def make_seed_channel(fixtures_dir: Path) -> SeedChannel:
    """One mirror channel holding every cluster's torch build (rows added one by one)."""
    import time

    from extforge import mirror

    channel = fixtures_dir / "seed-channel"
    rows: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    fixtures_dir.mkdir(parents=True, exist_ok=True)
    packages: list[str] = []
    pythons = {c.name: find_python(c.python) for c in CLUSTERS}
    # pip fetches the next rows' wheels (network and disk) while this row is packaged (CPU):
    # cold, the downloads took 46-108 s a row.
    fetcher = ThreadPoolExecutor(max_workers=1)
    with exclusive(fixtures_dir / "seed-channel.lock"):
        try:
            fetched = {c.name: fetcher.submit(mirror.from_pip, mirror.pip_requirements(f"torch=={c.torch}", []), python)
                       for c in CLUSTERS if (python := pythons[c.name])}
            for c in CLUSTERS:
                if c.name not in fetched:
                    skipped[c.name] = f"no CPython {c.python} here (pyenv install {c.python})"
                    continue
                start = time.monotonic()
                result = mirror.build_mirror(channel, fetched[c.name].result())
                seconds[c.name] = time.monotonic() - start
                rows[c.name] = result.variants
                packages += [str(p.path) for p in result.packages]
                nvcc = result.variants.get("cuda_compiler_version", "")
                if nvcc.split(".")[0] != c.cuda.split(".")[0]:
                    skipped[c.name] = (f"the channel's CUDA toolkit for torch {c.torch}+cu{c.cuda.replace('.', '')} is "
                                       f"{nvcc or 'none'}; torch refuses an nvcc of another major")
        finally:
            fetcher.shutdown(cancel_futures=True)
    tmp = _warm_record().with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"packages": packages, "generation": code_generation()}))
    tmp.replace(_warm_record())
    return SeedChannel(channel, rows, skipped, seconds)


def _mark_warm_parts_used(record: Path, extracted: Path) -> None:
    """This session is about to use what the record lists: marked, the cache's room-making
    (which removes entries unused for 30 minutes) leaves them, and the record, in place."""
    packages = _warm_packages(record)
    for used in (record, *(f.parent for f in packages), *(extracted / f.name.removesuffix(".conda") for f in packages)):
        if used.exists():
            paths.mark_used(used)


def seed_shortfall(fixtures_dir: Path, besides: float = 0.0, channel_made: bool = False) -> str | None:
    """disk_shortfall of this cache, after it made room for the rows' cold parts (the least
    recently used entries of other checkouts and generations go first); `besides`: GiB the disk
    must keep for other work as well."""
    fixtures_dir.mkdir(parents=True, exist_ok=True)
    need = disk_need(_warm_record(), paths.rattler_pkgs_dir(), channel_made)
    _mark_warm_parts_used(_warm_record(), paths.rattler_pkgs_dir())
    cache.make_room(paths.cache_root(), "the seed rows", need=int((need.total + besides) * 2**30))
    return disk_shortfall(shutil.disk_usage(fixtures_dir).free - int(besides * 2**30), need)


@pytest.fixture(scope="session")
def seed_channel(fixtures_dir: Path) -> SeedChannel:
    # The session's start began this work in the background (prepare.py); what it finished is
    # warm here, what it did not (it failed or was stopped) is done again, its errors raised here.
    prepare.wait()
    made = prepare.made_channel(fixtures_dir)
    shortfall = seed_shortfall(fixtures_dir, channel_made=made is not None)
    if shortfall:
        pytest.skip(shortfall)
    return made or make_seed_channel(fixtures_dir)


@dataclass
class SeedBuilds:
    channel: Path  # one output channel with every row's package
    packages: dict[str, Path]  # cluster name -> its .conda
    seconds: dict[str, float]


def make_seed_builds(seed_channel: SeedChannel, fixtures_dir: Path) -> SeedBuilds:
    """demo-ext, the recipe unchanged, built for each row the channel can build, into one channel."""
    import time

    from extforge.building.build import build_recipe
    from extforge.building.build_options import BuildOptions
    from extforge.publishing.index import index_channel

    out = fixtures_dir / "seed-ext" / build_key(DEMO_RECIPE, seed_channel.path)
    packages: dict[str, Path] = {}
    seconds: dict[str, float] = {}
    with exclusive(fixtures_dir / "seed-ext.lock"):
        for c in CLUSTERS:
            if c.name in seed_channel.skipped:
                continue
            row = seed_channel.rows[c.name]
            done = out / f".complete-{c.name}"
            if not done.exists():
                start = time.monotonic()
                # The recipe's own tests are left to the per-row env tests below (same import, one solve less).
                built = build_recipe(BuildOptions.make(DEMO_RECIPE, [seed_channel.path], out, test=False, variants={
                    "python": [row["python"]], "pytorch": [row["pytorch"]], "cuda_archs": [c.archs]}))
                (pkg,) = [p.path for p in built if p.name == "demo-ext"]
                done.write_text(json.dumps({"package": pkg.name, "seconds": time.monotonic() - start}))
            record = json.loads(done.read_text())
            packages[c.name] = out / "linux-64" / record["package"]
            seconds[c.name] = record["seconds"]
        index_channel(out)  # rows built by earlier runs: their entries as the files are now
    return SeedBuilds(out, packages, seconds)


@pytest.fixture(scope="session")
def seed_builds(seed_channel: SeedChannel, fixtures_dir: Path) -> SeedBuilds:
    return make_seed_builds(seed_channel, fixtures_dir)


def env_name(row: str) -> str:
    """The row's environment: pixi's names are lowercase letters, digits and dashes."""
    return f"row-{row.lower()}"


def make_seed_lock(seed_channel: SeedChannel, seed_builds: SeedBuilds, fixtures_dir: Path) -> Path | None:
    """One pixi.toml with an environment per built row (its torch pinned, plus demo-ext), locked
    once in a fresh seed-envs folder; None when no row was built."""
    rows = [c for c in CLUSTERS if c.name in seed_builds.packages]
    if not rows:
        return None
    root = fixtures_dir / "seed-envs"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    lines = ["[workspace]", 'name = "seed-clusters"',
             f'channels = ["{seed_builds.channel.resolve().as_uri()}", "{seed_channel.path.resolve().as_uri()}"]',
             'platforms = ["linux-64"]', "", "[system-requirements]", 'cuda = "13.0"',
             # The builds require the glibc their audit found on this machine, where they were built.
             f'libc = "{detect().glibc}"', ""]
    for c in rows:
        lines += [f"[feature.{env_name(c.name)}.dependencies]", f'python = "{c.python}.*"', f'pytorch = "=={c.torch}"',
                  'demo-ext = "*"', ""]
    lines.append("[environments]")
    lines += [f'{env_name(c.name)} = ["{env_name(c.name)}"]' for c in rows]
    manifest = root / "pixi.toml"
    manifest.write_text("\n".join(lines) + "\n")
    proc = run_extforge("lock", "--manifest", str(manifest))
    assert proc.returncode == 0, proc.stderr
    return root / "pixi.lock"


def install_row_env(lock: Path, cluster: Cluster) -> tuple[subprocess.CompletedProcess, Path]:
    """`extforge install` of the row's environment beside its lock; the run and the prefix."""
    prefix = lock.parent / f"env-{cluster.name}"
    return run_extforge("install", env_name(cluster.name), "--prefix", str(prefix), "--lock", str(lock)), prefix


@pytest.fixture(scope="session")
def seed_lock(seed_channel: SeedChannel, seed_builds: SeedBuilds, fixtures_dir: Path) -> Path:
    """The lock this session's background wrote (its envs installed beside it, as far as it
    got), else one written here."""
    lock = prepare.made_lock(fixtures_dir) or make_seed_lock(seed_channel, seed_builds, fixtures_dir)
    if lock is None:
        pytest.skip("no cluster row could be built here: " + "; ".join(f"{k}: {v}" for k, v in seed_channel.skipped.items()))
    return lock


WRONG_ABI_RECIPE = Path(__file__).parent / "data" / "wrong-abi-ext"
WRONG_ABI_ROW = "C"  # torch 2.6: the old C++ ABI


@dataclass(frozen=True)
class WrongAbiBuild:
    package: Path
    audit_verdict: str


def make_wrong_abi_package(seed_channel: SeedChannel, fixtures_dir: Path) -> WrongAbiBuild | None:
    """A C++ torch extension built for row C with the new C++ ABI forced on (no CUDA: no toolkit
    needed), or None without row C. Cached like the seed builds (cold: 68 s of the foreground,
    now built by prepare.py in the background); the audit's verdict is kept with it."""
    from extforge.building.build import build_recipe
    from extforge.building.build_options import BuildOptions

    if WRONG_ABI_ROW not in seed_channel.rows:
        return None
    out = fixtures_dir / "wrong-abi-ext" / build_key(WRONG_ABI_RECIPE, seed_channel.path)
    done = out / ".complete"
    with exclusive(fixtures_dir / "wrong-abi-ext.lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            row = seed_channel.rows[WRONG_ABI_ROW]
            built = build_recipe(BuildOptions.make(WRONG_ABI_RECIPE, [seed_channel.path], out, test=False,
                                                   variants={"python": [row["python"]], "pytorch": [row["pytorch"]]}))
            (pkg,) = [p for p in built if p.name == "wrong-abi-ext"]
            done.write_text(json.dumps({"package": str(pkg.path.relative_to(out)), "audit_verdict": pkg.audit_verdict}))
        record = json.loads(done.read_text())
    return WrongAbiBuild(out / record["package"], record["audit_verdict"])
