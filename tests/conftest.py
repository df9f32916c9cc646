"""Session fixtures shared by every area's tests; expensive results are cached under cache_root().
Several test sessions on one machine share those caches: one builds under a lock, the others wait.
A session holding the seed rows starts their cold work at once, in the background (tests/seed/prepare.py).

mirror_channel: the upstream channel mirrored from pip's torch 2.14.1+cu130 (content-addressed
    cache: seconds when warm, ~10 min cold on 2 cores).
demo_channel / demo_package / demo_wheel: recipe/demo-ext built against it with --wheel (reused
    while the recipe and the mirror channel are unchanged).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from extforge import paths
from extforge.building.build import WORK_AREA
from extforge.locking import exclusive
from extforge.planning import cost_store
from fixture_keys import build_key
from pip_clients import clean_client_env

REPO = Path(__file__).resolve().parent.parent
DEMO_RECIPE = REPO / "recipe" / "demo-ext"
MIRROR_TORCH = "torch==2.14.1"


def _fixtures_dir() -> Path:
    # Keyed by checkout: two clones with different mirror code would otherwise rewrite one
    # channel under each other's running tests. The packages stay shared (content-addressed).
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    return paths.cache_root() / "test-fixtures" / checkout


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session that holds the seed rows starts their cold work now, in the background
    (tests/seed/prepare.py), the torch 2.14.1 wheels of `mirror_channel` first: the tests before
    the seed rows leave part of the cores and all the network idle."""
    if session.config.option.collectonly or not any("seed_channel" in getattr(item, "fixturenames", ())
                                                    for item in session.items):
        return
    from extforge import mirror
    from seed import prepare

    prepare.start(_fixtures_dir(), [mirror.pip_requirements(MIRROR_TORCH, [])])


def pytest_sessionfinish(session: pytest.Session) -> None:
    prepare = sys.modules.get("seed.prepare")  # imported where a background was started
    if prepare is not None:
        prepare.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # The session's fixtures stay in use however long it runs: work that makes room on the disk
    # (cache.make_room) removes only entries unused for half an hour.
    if _fixtures_dir().is_dir():
        paths.mark_used(_fixtures_dir())


@pytest.fixture(autouse=True)
def no_work_folder_left() -> Iterator[None]:
    """A failed build keeps its work folder in the cache's builds area for its user to look at
    (its error names it): a test's failing builds must not leave theirs in this machine's cache
    (a build env is several GB). What was there before the test stays."""
    area = paths.own_area(WORK_AREA, create=False)
    before = set(area.iterdir()) if area.is_dir() else set()
    yield
    if area.is_dir():
        for entry in set(area.iterdir()) - before:
            shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_cost_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts from an empty build-cost store (created on first write): what this
    machine's own builds taught extforge never changes a test's plan."""
    store = tmp_path_factory.getbasetemp() / "cost-stores" / hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    monkeypatch.setenv(cost_store.STORE_ENV, str(store))
    return store


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Where this checkout's session fixtures live (other areas' conftests build theirs there)."""
    path = _fixtures_dir()
    path.mkdir(parents=True, exist_ok=True)
    paths.mark_used(path)
    return path


@pytest.fixture(scope="session")
def mirror_channel() -> Path:
    """Path of the mirror channel (python, pytorch 2.14.1+cu130, compilers) built from pip's wheels."""
    from extforge import mirror

    channel = _fixtures_dir() / "mirror-channel"
    with exclusive(_fixtures_dir() / "mirror.lock"):
        inputs = mirror.from_pip(mirror.pip_requirements(MIRROR_TORCH, []))
        mirror.build_mirror(channel, inputs)
    return channel


@pytest.fixture(scope="session")
def demo_channel(mirror_channel: Path) -> Path:
    """Channel folder holding demo-ext built (tests run, audited, its wheel made) against `mirror_channel`."""
    from extforge.building.build import build_recipe
    from extforge.building.build_options import BuildOptions

    out = _fixtures_dir() / "demo-ext" / build_key(DEMO_RECIPE, mirror_channel)
    with exclusive(_fixtures_dir() / "demo-ext.lock"):
        if not (out / ".complete").exists():
            shutil.rmtree(out, ignore_errors=True)
            build_recipe(BuildOptions.make(DEMO_RECIPE, [mirror_channel], out, wheel=True))
            (out / ".complete").touch()
    return out


@pytest.fixture(scope="session")
def demo_package(demo_channel: Path) -> Path:
    """Path of the built demo-ext .conda."""
    (pkg,) = sorted((demo_channel / "linux-64").glob("demo-ext-*.conda"))
    return pkg


@pytest.fixture(scope="session")
def demo_wheel(demo_channel: Path) -> Path:
    """Path of the wheel `extforge build --wheel` made of the demo-ext package."""
    (wheel,) = sorted((demo_channel / "wheels").glob("demo_ext-*.whl"))
    return wheel


def _distro_python() -> str | None:
    """A Debian-style /usr/bin python of our minor (stdlib in /usr/lib/python3.X, dist-packages)."""
    short = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidate = Path(f"/usr/bin/python{short}")
    return str(candidate) if candidate.exists() and Path(f"/usr/lib/python{short}/os.py").exists() else None


@pytest.fixture(scope="session")
def distro_torch_venv(mirror_channel: Path) -> Path:
    """A venv on the distro python holding torch 2.14.1 (without its nvidia wheels, to stay lean)."""
    from extforge import mirror

    base = _distro_python()
    if not base:
        pytest.skip("no distribution python of this minor with its stdlib in /usr/lib")
    venv = _fixtures_dir() / "distro-torch-venv"
    wheels = mirror.inputs.pip_wheel_dir(mirror.pip_requirements(MIRROR_TORCH, []), f"{sys.version_info[0]}.{sys.version_info[1]}")
    with exclusive(venv.parent / "distro-torch-venv.lock"):
        if not (venv / ".complete").exists():
            subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
            subprocess.run([*pip, "--no-deps", MIRROR_TORCH, "packaging", "filelock"], check=True)
            (venv / ".complete").touch()
    return venv


@pytest.fixture(scope="session")
def pip_torch_venv(mirror_channel: Path) -> Path:
    """A venv holding pip's torch 2.14.1 and every wheel it depends on (the nvidia-* libraries
    too: pip's layout, as a pip user has it), installed with --no-index from the wheels the
    mirror channel was made from. Tests copy it (hard links) before installing into it."""
    from extforge import mirror

    venv = _fixtures_dir() / "pip-torch-venv"
    wheels = mirror.inputs.pip_wheel_dir(mirror.pip_requirements(MIRROR_TORCH, []), f"{sys.version_info[0]}.{sys.version_info[1]}")
    with exclusive(venv.parent / "pip-torch-venv.lock"):
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "--no-index",
                            "--find-links", str(wheels), MIRROR_TORCH], check=True, env=clean_client_env())
            (venv / ".complete").touch()
    return venv


@pytest.fixture(scope="session")
def ccache() -> str:
    """ccache's path, installed with apt-get where it is missing and this is root on Debian (as
    CI is); the split build carries objects through it."""
    found = shutil.which("ccache")
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        # A fresh machine's package lists may be empty: install from them, else update them first.
        for steps in ([["apt-get", "install", "-y", "-qq", "ccache"]],
                      [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "ccache"]]):
            for argv in steps:
                subprocess.run(argv, capture_output=True, check=False, timeout=900,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if found := shutil.which("ccache"):
                break
    if not found:
        pytest.skip("ccache is not installed and cannot be here (apt-get install ccache)")
    return found
