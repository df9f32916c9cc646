"""pip and uv (the real clients, from PyPI) install demo-ext's wheel from a file:// wheel index into a
fresh venv holding pip's torch 2.14.1+cu130, the torch the mirror channel was made from; auditwheel
judges its tag. Before these, a pip user got no wheel of an extforge build at all, and the conda
package's own module (RPATH `$ORIGIN/../../..`, the prefix's lib/) finds no libc10.so in a venv."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from cli_run import run_extforge
from extforge.hashing import sha256_file
from extforge.wheel.index import publish_wheels
from extforge.wheel.make import record_hash, wheel_from_conda
from pip_clients import clean_client_env

pytestmark = pytest.mark.slow

ROW = "torch2.14.1-cu130"
CLIENTS = ["pip", "uv"]
UV = str(Path(sys.executable).parent / "uv")
# Run in a new process of the venv: the module loads by its own search paths before torch is
# imported (a conda package's module would not find libc10.so here), then works beside torch.
CHECK = """
import ctypes, importlib.metadata, pathlib, sys
site = pathlib.Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
(module,) = (site / "demo_ext").glob("_C.*.so")
ctypes.CDLL(str(module))
import torch, demo_ext
x, w = torch.randn(3, 64), torch.rand(64)
y = demo_ext.rms_norm_reference(x, w)
assert y.shape == x.shape and torch.isfinite(y).all()
assert hasattr(torch.ops.demo_ext, "rms_norm")
print(importlib.metadata.version("demo-ext"), torch.__version__, (pathlib.Path(sys.prefix) / "share/extforge/audit/demo-ext.json").is_file())
"""


@pytest.fixture(scope="module")
def wheel_index(demo_package: Path, mirror_channel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """demo-ext published with the real CLI into a wheel index, beside its channel publish."""
    index = tmp_path_factory.mktemp("wheel-index")
    channel = tmp_path_factory.mktemp("channel")
    proc = run_extforge("publish", str(demo_package), "--channel", str(channel), "--wheels", str(index),
                        "--upstream", str(mirror_channel), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr
    return index, json.loads(proc.stdout)


def _venv(pip_torch_venv: Path, tmp: Path) -> Path:
    """A fresh venv holding pip's torch: the cached one's files hard-linked (an install replaces
    files, never writes into them)."""
    venv = tmp / "venv"
    subprocess.run(["cp", "-al", str(pip_torch_venv), str(venv)], check=True)
    return venv


def _install(client: str, venv: Path, index_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    python = str(venv / "bin" / "python")
    argv = ([python, "-m", "pip", "install", "--no-cache-dir"] if client == "pip"
            else [UV, "pip", "install", "--python", python])
    # Over HTTP the index is this machine's own server on the loopback: nothing else is reached.
    loopback = {"UV_OFFLINE": "0", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"} if index_url.startswith("http") else {}
    return subprocess.run([*argv, "--index-url", index_url, *args], capture_output=True, text=True, timeout=600,
                          env=clean_client_env(UV_CACHE_DIR=str(venv.parent / "uv-cache"), **loopback))


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[str]:
    """The folder served over HTTP by a plain static server (Python's) on the loopback; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _installed(venv: Path) -> dict[str, str]:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], capture_output=True,
                         text=True, check=True, env=clean_client_env())
    return {d["name"].lower(): d["version"] for d in json.loads(out.stdout)}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("transport", ["file", "http"])
def test_the_published_wheel_installs_with_the_real_client_and_runs(client: str, transport: str, wheel_index: tuple[Path, dict],
                                                                     pip_torch_venv: Path, tmp_path: Path) -> None:
    """From the folder (file://, as on NFS) and from the same folder served by a static HTTP server."""
    index, published = wheel_index
    (entry,) = published["wheels"]["wheels"]
    assert entry["file"].startswith(f"{ROW}/simple/demo-ext/demo_ext-0.1.0+cu130torch2.14cxx11abiTRUE-cp311-cp311-manylinux_2_")
    assert [p["status"] for p in published["packages"]] == ["published"]  # the conda package, same command
    venv = _venv(pip_torch_venv, tmp_path)
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(_served(index)) if transport == "http" else index.as_uri()
        proc = _install(client, venv, f"{base}/{ROW}/simple", "demo-ext")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK, ], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0.1.0+cu130torch2.14cxx11abiTRUE", "2.14.1+cu130", "True"]


def _other_torch_package(package: Path, dest: Path) -> Path:
    """demo-ext's package as if built for torch 2.9.1+cu128: its run requirement on pytorch rewritten."""
    out = dest / package.name
    with zipfile.ZipFile(package) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.startswith("info-"):
                tar_in = tarfile.open(fileobj=io.BytesIO(zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30)))
                buf = io.BytesIO()
                with tar_in, tarfile.open(fileobj=buf, mode="w") as tar_out:
                    for member in tar_in:
                        content = tar_in.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
                        if member.name == "info/index.json" and content is not None:
                            index = json.loads(content)
                            index["depends"] = [d.replace("2.14.1 cuda130", "2.9.1 cuda128") for d in index["depends"]]
                            content = json.dumps(index).encode()
                            member.size = len(content)
                        tar_out.addfile(member, io.BytesIO(content) if content is not None else None)
                data = zstandard.ZstdCompressor().compress(buf.getvalue())
            zout.writestr(item, data)
    return out


@pytest.mark.parametrize("client", CLIENTS)
def test_a_wheel_for_another_torch_is_refused_by_the_resolver(client: str, demo_package: Path, pip_torch_venv: Path,
                                                              tmp_path: Path) -> None:
    """Its Requires-Dist torch==2.9.1 cannot be met beside the venv's torch 2.14.1+cu130."""
    venv = _venv(pip_torch_venv, tmp_path)
    (tmp_path / "pkg").mkdir()
    other = wheel_from_conda(_other_torch_package(demo_package, tmp_path / "pkg"), tmp_path / "made", venv)
    assert other.version == "0.1.0+cu128torch2.9cxx11abiTRUE" and other.torch.row == "torch2.9.1-cu128"
    publish_wheels([(other, "pass")], tmp_path / "index")
    proc = _install(client, venv, (tmp_path / "index" / "torch2.9.1-cu128" / "simple").as_uri(), "demo-ext")
    assert proc.returncode != 0
    assert "torch==2.9.1" in proc.stdout + proc.stderr
    installed = _installed(venv)
    assert installed["torch"] == "2.14.1" and "demo-ext" not in installed


def _one_byte_changed(wheel: Path) -> None:
    """The wheel with one byte of its Python code changed, and otherwise whole: every zip CRC and its
    RECORD agree with the new bytes, so only the index's sha256 can tell."""
    with zipfile.ZipFile(wheel) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    init = next(n for n in members if n.endswith("demo_ext/__init__.py"))
    members[init] = members[init].replace(b"Fused", b"Gused", 1)
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    lines = [f"{init},{record_hash(members[init])},{len(members[init])}" if line.startswith(f"{init},") else line
             for line in members[record].decode().splitlines()]
    members[record] = ("\n".join(lines) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_wheel_with_a_changed_byte_is_refused_by_its_hash(client: str, wheel_index: tuple[Path, dict],
                                                            pip_torch_venv: Path, tmp_path: Path) -> None:
    index = tmp_path / "index"
    shutil.copytree(wheel_index[0], index)
    (wheel,) = (index / ROW / "simple" / "demo-ext").glob("*.whl")
    _one_byte_changed(wheel)
    venv = _venv(pip_torch_venv, tmp_path)
    proc = _install(client, venv, (index / ROW / "simple").as_uri(), "demo-ext")
    assert proc.returncode != 0
    assert "hash" in (proc.stdout + proc.stderr).lower()
    assert "demo-ext" not in _installed(venv)


def test_the_manylinux_tag_is_auditwheels_verdict_and_the_build_and_publish_give_one_wheel(
        demo_wheel: Path, wheel_index: tuple[Path, dict], pip_torch_venv: Path) -> None:
    """auditwheel, given the venv's torch and nvidia folders to resolve against, reads the same
    policy from the symbols; its only objection is that torch's libraries are not in the wheel,
    which is what a torch extension wheel must not do (they come with the torch it pins)."""
    site = pip_torch_venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    libs = [site / "torch" / "lib", site / "nvidia" / "cu13" / "lib"]
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", "--ldpaths", ":".join(map(str, libs)),
                          str(demo_wheel)], capture_output=True, text=True, check=True)
    verdict = json.loads(out.stdout)
    tag = demo_wheel.name.removesuffix(".whl").rsplit("-", 1)[1]
    assert verdict["sym_tag"] == tag
    external = {Path(p).parent for p in verdict["external_libs"].values() if p}
    assert external and external <= set(libs)
    assert {"libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libcudart.so.13"} <= set(verdict["external_libs"])
    (published,) = wheel_index[1]["wheels"]["wheels"]
    # One build, two artifacts: the wheel `extforge build --wheel` wrote is the one publish derived.
    assert published["sha256"] == sha256_file(demo_wheel) and published["file"].endswith(demo_wheel.name)


def test_publish_refuses_a_wheel_needing_more_than_the_sites_target(demo_package: Path, mirror_channel: Path,
                                                                    tmp_path: Path) -> None:
    """demo-ext, compiled by this machine's gcc 12 on glibc 2.36, needs GLIBC_2.32: a site whose
    nodes run glibc 2.28 (`--manylinux 2_28`) is told which symbol and how to build lower."""
    index = tmp_path / "wheels"
    proc = run_extforge("publish", str(demo_package), "--wheels", str(index), "--upstream", str(mirror_channel),
                        "--manylinux", "2_28", timeout=900)
    assert proc.returncode == 1, proc.stderr
    assert "newer than the site's target manylinux_2_28" in proc.stderr and "@GLIBC_2.32 (from libc.so.6)" in proc.stderr
    assert "older compiler and sysroot" in proc.stderr
    assert not list(index.rglob("*.whl"))
