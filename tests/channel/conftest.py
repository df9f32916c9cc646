"""Tiny real packages built with py-rattler-build, and a loopback HTTP server for channels."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from extforge import engine

N_PACKAGES = 16

RECIPE = """\
package:
  name: {name}
  version: "{version}"
build:
  noarch: generic
  number: 0
  string: {build}
  script:
    - mkdir -p $PREFIX/share/{name}
    - echo "{payload}" > $PREFIX/share/{name}/data.txt
    - echo "installed in $PREFIX" > $PREFIX/share/{name}/where.txt
requirements:
  run: [{run}]
"""


@dataclass(frozen=True)
class TinyPackages:
    distinct: list[Path]  # N_PACKAGES packages tiny-00 … tiny-15
    clash: Path  # tiny-00's file name with other bytes
    app: Path  # depends on tiny-00 and tiny-01; its where.txt holds a prefix placeholder


def build_package(workdir: Path, name: str, *, payload: str = "", run: str = "", version: str = "1.0", build: str = "h0_0") -> Path:
    from rattler_build import Stage0Recipe

    recipe_dir = workdir / f"recipe-{name}-{abs(hash(payload)) % 10**8}"
    recipe_dir.mkdir(parents=True)
    (recipe_dir / "recipe.yaml").write_text(
        RECIPE.format(name=name, version=version, build=build, payload=payload or name, run=run)
    )
    out = recipe_dir / "out"
    empty = workdir / "empty-channel"
    (empty / "noarch").mkdir(parents=True, exist_ok=True)
    Stage0Recipe.from_file(recipe_dir / "recipe.yaml").run_build(output_dir=out, channels=[empty.as_uri()])
    (pkg,) = (out / "noarch").glob(f"{name}-*.conda")
    return pkg


@pytest.fixture(scope="session")
def tiny_packages(tmp_path_factory) -> TinyPackages:
    work = tmp_path_factory.mktemp("tiny-build")
    # rattler-build resolves nothing here; its cache goes where every extforge build puts it
    # (a session-wide RATTLER_CACHE_DIR in tmp sent every later build of the run there, cold).
    engine.prepare_environment()
    distinct = [build_package(work, f"tiny-{i:02d}") for i in range(N_PACKAGES)]
    clash = build_package(work, "tiny-00", payload="other bytes, same file name")
    app = build_package(work, "tiny-app", run="tiny-00, tiny-01")
    assert clash.name == distinct[0].name and clash.read_bytes() != distinct[0].read_bytes()
    return TinyPackages(distinct, clash, app)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_root(tmp_path) -> Iterator[tuple[Path, str]]:
    """A folder served on loopback: (folder, base URL)."""
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """extforge's package store and rattler's cache in tmp, so tests never share verified copies."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EXTFORGE_CACHE", str(cache))
    monkeypatch.setenv("RATTLER_CACHE_DIR", str(cache / "rattler"))
    return cache


def copy_packages(pkgs: list[Path], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(p, dest / p.name)) for p in pkgs]


from channel.pip_envs import pip_site  # noqa: E402, F401  (pip users: a wheel index, pip and uv)
from peers import peer_site  # noqa: E402, F401  (the multi-user fixture, shared with other areas)
