"""Rows A, B and C through the wheel path: each row's seed build published with the real CLI into
one wheel index, then installed by real pip and uv beside the row's torch, imported and run
there, and audited against that environment.

Where: the guide's user, a conda env holding pip's torch (the row's installed env: the mirror's
pytorch is pip's torch with its dist-info, so both clients see torch installed). pip installs
into a venv made on it with `python -m venv --system-site-packages` (nothing copied); uv does not
read a venv's system site-packages (astral-sh/uv#7358: it would fetch torch again), so it
installs into the env itself, a hard-linked copy (an install replaces files, never writes into
them: a few MB).

The old code labelled rows A and B `+cu124torch2.9` (the nvcc that compiled them, not their
torch's CUDA: pip's torch is 2.9.1+cu128, and the wheel sits in the torch2.9.1-cu128 index),
and `extforge audit WHEEL --against VENV` found no torch in a --system-site-packages venv (it
never looked past the venv's own site-packages)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_run import run_extforge
from pip_clients import clean_client_env

from .conftest import CLUSTERS, Cluster, SeedBuilds, SeedChannel, install_row_env

pytestmark = [pytest.mark.slow, pytest.mark.seed]
ROWS = ["A", "B", "C"]
CLIENTS = ["pip", "uv"]
UV = str(Path(sys.executable).parent / "uv")
# What each row's wheel must say it is: its torch row's index, its version's local label.
INDEX = {"A": "torch2.9.1-cu128", "B": "torch2.9.1-cu128", "C": "torch2.6.0-cu124"}
LABEL = {"A": "cu128torch2.9cxx11abiTRUE", "B": "cu128torch2.9cxx11abiTRUE", "C": "cu124torch2.6cxx11abiFALSE"}
# Run in the environment: the wheel's module, not the row env's conda demo-ext, beside the row's
# torch. Where torch lies beside it (in the env) the module loads by its own search path before
# torch is imported; in a venv on the env, torch's libraries are not at its $ORIGIN/../torch/lib
# but loaded by `import torch` first, as demo_ext's own __init__ does.
CHECK = """
import ctypes, importlib.metadata, importlib.util, pathlib, sys
package = pathlib.Path(importlib.util.find_spec("demo_ext").origin).parent
assert package.is_relative_to(sys.prefix), package
if (package.parent / "torch" / "lib").is_dir():
    (module,) = package.glob("_C.*.so")
    ctypes.CDLL(str(module))
import torch, demo_ext
x, w = torch.randn(3, 64), torch.rand(64)
y = demo_ext.rms_norm_reference(x, w)
assert y.shape == x.shape and torch.isfinite(y).all()
assert hasattr(torch.ops.demo_ext, "rms_norm")
print(importlib.metadata.version("demo-ext"), torch.__version__)
"""


def _cluster(name: str) -> Cluster:
    return next(c for c in CLUSTERS if c.name == name)


def _tag(c: Cluster) -> str:
    return f"cp{c.python.replace('.', '')}"


@dataclass
class SeedWheels:
    index: Path
    wheels: dict[str, Path]  # row -> its published wheel


@pytest.fixture(scope="module")
def seed_wheels(seed_channel: SeedChannel, seed_builds: SeedBuilds, tmp_path_factory: pytest.TempPathFactory) -> SeedWheels:
    """The rows' packages published by one `extforge publish --wheels` into one index."""
    rows = [_cluster(n) for n in ROWS if n in seed_builds.packages]
    if not rows:
        pytest.skip("no row of A, B and C was built: " + "; ".join(f"{k}: {v}" for k, v in seed_channel.skipped.items()))
    index = tmp_path_factory.mktemp("seed-wheels")
    proc = run_extforge("publish", *(str(seed_builds.packages[c.name]) for c in rows), "--wheels", str(index),
                        "--upstream", str(seed_channel.path), "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr
    files = [w["file"] for w in json.loads(proc.stdout)["wheels"]["wheels"]]
    wheels = {}
    for c in rows:
        stem = f"{INDEX[c.name]}/simple/demo-ext/demo_ext-0.1.0+{LABEL[c.name]}-{_tag(c)}-{_tag(c)}-manylinux_"
        wheels[c.name] = index / next((f for f in files if f.startswith(stem)), f"row {c.name}: no {stem}* in {files}")
    return SeedWheels(index, wheels)


@pytest.fixture(scope="module")
def row_envs(seed_wheels: SeedWheels, seed_lock: Path) -> dict[str, Path]:
    """Each row's installed env (prepare.py installed it; `extforge install` checks it here, once,
    before any test links its files elsewhere)."""
    envs = {}
    for name in seed_wheels.wheels:
        proc, envs[name] = install_row_env(seed_lock, _cluster(name))
        assert proc.returncode == 0, proc.stderr
    return envs


@pytest.fixture
def beside_torch(row_envs: dict[str, Path], tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """make(client, row): where `client` installs beside the row's torch (the module's docstring
    says why each)."""
    made: list[Path] = []

    def make(client: str, row: str) -> Path:
        env, dest = row_envs[row], tmp_path / f"env-{client}-{row}"
        if client == "uv":
            subprocess.run(["cp", "-al", str(env), str(dest)], check=True)
            made.append(dest)
        else:
            subprocess.run([str(env / "bin" / "python"), "-m", "venv", "--system-site-packages", "--without-pip", str(dest)],
                           check=True)
        return dest

    yield make
    # Left behind, the copy's second names of the env's files would make `extforge install` take
    # the env as changed (a later session's check of it refuses).
    for dest in made:
        shutil.rmtree(dest)


@pytest.fixture(scope="module")
def pip(fixtures_dir: Path) -> Path:
    """pip from PyPI, run from its own venv into another's with --python (the rows' envs have no pip)."""
    from channel.pip_envs import pip_client

    return pip_client(fixtures_dir)


def _install(client: str, pip: Path, env: Path, index_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    python = str(env / "bin" / "python")
    argv = ([str(pip), "-m", "pip", "--python", python, "install", "--no-cache-dir", "-v"] if client == "pip"
            else [UV, "pip", "install", "--python", python])
    return subprocess.run([*argv, "--index-url", index_url, *args], capture_output=True, text=True, timeout=600,
                          env=clean_client_env(UV_CACHE_DIR=str(env.parent / "uv-cache")))


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name).decode()


@pytest.mark.parametrize("name", ROWS)
def test_each_rows_wheel_names_its_python_torch_abi_and_auditwheels_tag(name: str, seed_wheels: SeedWheels,
                                                                        row_envs: dict[str, Path]) -> None:
    c = _cluster(name)
    if name not in seed_wheels.wheels:
        pytest.skip(f"row {name} was not built")
    wheel = seed_wheels.wheels[name]
    metadata = _metadata(wheel)
    assert f"Version: 0.1.0+{LABEL[name]}\n" in metadata
    assert f"Requires-Python: =={c.python}.*\n" in metadata
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert requires[0] == f"torch=={c.torch}", requires
    # PEP 658: the index serves the same METADATA beside the wheel.
    assert Path(f"{wheel}.metadata").read_text() == metadata
    site = row_envs[name] / "lib" / f"python{c.python}" / "site-packages"
    libs = [site / "torch" / "lib", *sorted(site.glob("nvidia/*/lib"))]
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", "--ldpaths", ":".join(map(str, libs)),
                          str(wheel)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["sym_tag"] == wheel.name.removesuffix(".whl").rsplit("-", 1)[1]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", ROWS)
def test_each_rows_wheel_installs_beside_its_torch_runs_and_passes_the_audit(
        name: str, client: str, seed_wheels: SeedWheels, beside_torch: Callable[[str, str], Path], pip: Path) -> None:
    """The row's exact wheel (the row env's conda demo-ext is 0.1.0, which a bare `demo-ext`
    would take as installed); pip and uv pick it by the Python among A's and B's in one index
    (same version, cp310 and cp312) and keep the env's torch."""
    c = _cluster(name)
    if name not in seed_wheels.wheels:
        pytest.skip(f"row {name} was not built")
    env = beside_torch(client, name)
    proc = _install(client, pip, env, (seed_wheels.index / INDEX[name] / "simple").as_uri(), f"demo-ext==0.1.0+{LABEL[name]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if client == "pip":  # it resolved from the PEP 658 file the index announced
        assert f"{seed_wheels.wheels[name].name.replace('+', '%2B')}.metadata" in proc.stdout, proc.stdout
    site = env / "lib" / f"python{c.python}" / "site-packages"
    (wheel_file,) = site.glob("demo_ext-*.dist-info/WHEEL")
    assert f"Tag: {seed_wheels.wheels[name].name.removesuffix('.whl').split('-', 2)[2]}\n" in wheel_file.read_text()
    assert [d.name for d in site.glob("torch-*.dist-info")] == ([f"torch-{c.torch}.dist-info"] if client == "uv" else [])
    run = subprocess.run([str(env / "bin" / "python"), "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [f"0.1.0+{LABEL[name]}", f"{c.torch}+cu{c.cuda.replace('.', '')}"]
    audit = run_extforge("audit", str(seed_wheels.wheels[name]), "--against", str(env), timeout=600)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.parametrize("client", CLIENTS)
def test_row_cs_wheel_is_refused_beside_row_bs_torch(client: str, seed_wheels: SeedWheels,
                                                     beside_torch: Callable[[str, str], Path], pip: Path) -> None:
    """torch 2.6.0's wheel (old C++ ABI) beside row B's torch 2.9.1: the resolver refuses it for its
    Requires-Dist, and the audit names the torch it is built for."""
    if not {"B", "C"} <= set(seed_wheels.wheels):
        pytest.skip("rows B and C were not both built")
    env = beside_torch(client, "B")
    proc = _install(client, pip, env, (seed_wheels.index / INDEX["C"] / "simple").as_uri(), f"demo-ext==0.1.0+{LABEL['C']}")
    assert proc.returncode != 0
    assert "torch==2.6.0" in proc.stdout + proc.stderr
    assert [d.name for d in (env / "lib" / "python3.12" / "site-packages").glob("demo_ext-*")] == (
        ["demo_ext-0.1.0.dist-info"] if client == "uv" else [])   # uv: the row env's own, kept
    audit = run_extforge("audit", str(seed_wheels.wheels["C"]), "--against", str(env), timeout=600)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert "is built for another torch" in " ".join((audit.stdout + audit.stderr).split())
