"""`carry`: what an offline node lacks, into .carry/ (kept out of git), on a machine with network.

- site<XY>.tar.xz: extforge's dependencies for the node's Python (pyproject's, uv and auditwheel
  among them, resolved with theirs for that Python's manylinux wheels, and pytest) as one
  `pip install --target` tree, which `start` unpacks where the node's python lacks them;
- the source archives of recipe/flash-attn (the sdist, from PyPI) and recipe/flash-attn-3
  (upstream's git archives, which no index serves: `--sources DIR`), each checked against its
  recipe's sha256 by `extforge sources fetch`.

Run it with a python that has extforge's dependencies (the checkout's .venv), which also runs pip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

from .phases import CARRY, site_bundle
from .state import REPO

# The node's wheels: glibc 2.39 runs every one of these.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
RECIPES = ("recipe/flash-attn", "recipe/flash-attn-3")


def requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """extforge's runtime dependencies, and pytest (tests/gpu and upstream's tests run with it)."""
    return [*tomllib.loads(pyproject.read_text())["project"]["dependencies"], "pytest"]


def target(python_version: str) -> list[str]:
    """pip's options that pick wheels for the node's Python and platform, not this machine's."""
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *(a for p in PLATFORMS for a in ("--platform", p))]


def site_tree(python_version: str, dest: Path) -> None:
    """The dependencies, resolved for the target, unpacked as one --target tree into .carry."""
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="extforge-carry-") as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        subprocess.run([*pip, "download", "--quiet", "-d", str(wheels), *target(python_version), *requirements()], check=True)
        subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-index", "--no-compile", "--target", str(site),
                        *target(python_version), *map(str, sorted(wheels.glob("*.whl")))], check=True)
        partial = dest.with_name(dest.name + ".partial")
        with tarfile.open(partial, "w:xz", preset=6) as tf:
            for path in sorted(site.rglob("*")):
                tf.add(path, arcname=path.relative_to(site).as_posix(), recursive=False)
        partial.replace(dest)
        print(f"{dest}: {dest.stat().st_size / 2**20:.1f} MiB, {len(list(wheels.glob('*.whl')))} wheels:",
              " ".join(sorted(w.name.split("-")[0] + "-" + w.name.split("-")[1] for w in wheels.glob("*.whl"))))


def sources(carry: Path, from_dirs: list[Path]) -> None:
    """The recipes' archives, fetched and checked by `extforge sources fetch`, copied by name into .carry."""
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    with tempfile.TemporaryDirectory(prefix="extforge-carry-") as tmp:
        for recipe in RECIPES:
            proc = subprocess.run([sys.executable, "-m", "extforge", "sources", "fetch", recipe, "--json", "--dest", tmp,
                                   *(a for d in from_dirs for a in ("--from", str(d)))],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{recipe}: {proc.stderr.strip()}")
            for source in json.loads(proc.stdout)["sources"]:
                shutil.copyfile(source["path"], carry / Path(source["path"]).name)
                print(f"{carry / Path(source['path']).name} ({source['how']}, sha256 {source['sha256'][:12]}...)")


def prepare(python_version: str, from_dirs: list[Path], carry: Path = CARRY) -> None:
    carry.mkdir(exist_ok=True)
    site_tree(python_version, carry / site_bundle(python_version))
    sources(carry, from_dirs)
