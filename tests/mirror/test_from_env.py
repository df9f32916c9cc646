"""`--from-env` as on an offline GPU node: a venv on a distribution python with torch installed."""

from __future__ import annotations

import asyncio
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from extforge import paths

HOST_CUDA = Path("/usr/local/cuda")


@pytest.mark.slow
def test_from_env_packages_the_distro_python_and_its_torch(distro_torch_venv: Path, tmp_path: Path):
    """As on the offline H100 node: the toolkit is the machine's own, copied into the packages."""
    if not (HOST_CUDA / "bin" / "nvcc").exists():
        pytest.skip(f"no CUDA toolkit in {HOST_CUDA}")
    channel = tmp_path / "channel"
    proc = subprocess.run(
        [sys.executable, "-m", "extforge", "mirror", "--channel", str(channel), "--json",
         "--from-env", str(distro_torch_venv / "bin" / "python"), "--extra", "filelock",
         "--cuda-home", str(HOST_CUDA)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    by_name = {p["name"]: p for p in summary["packages"]}
    assert by_name["pytorch"]["version"] == "2.14.1"
    assert by_name["pytorch"]["build"].startswith("cuda130_py311_")
    assert by_name["python"]["version"].startswith("3.11.")
    assert {"packaging", "filelock", "gcc_linux-64", "cuda-nvcc_linux-64", "cuda-cudart-dev"} <= set(by_name)
    assert by_name["cuda-nvcc-tools"]["build"].startswith("host_")
    assert 'cuda_compiler_version: ["13.0"]' in (channel / "variants.yaml").read_text()
    # torch's nvidia/triton wheels are not in this venv: reported, not silently required.
    assert "triton" in summary["missing_dependencies"]
    assert (channel / "variants.yaml").read_text().count('python: ["3.11"]') == 1

    from rattler import install, solve

    prefix = tmp_path / "env"

    async def solve_install() -> None:
        records = await solve([channel.resolve().as_uri()], ["python", "packaging"], platforms=["linux-64", "noarch"])
        await install(records, target_prefix=prefix, cache_dir=paths.rattler_pkgs_dir(), show_progress=False)

    asyncio.run(solve_install())
    # The relocated distro python runs from the new prefix and sees packages installed there
    # (Debian's site.py only reads dist-packages; the package links it to site-packages).
    out = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import sys, packaging, sysconfig; print(sys.prefix); "
         "print(packaging.__file__); print(sysconfig.get_paths()['include'])"],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    sys_prefix, packaging_file, include = out.stdout.split()
    assert Path(sys_prefix) == prefix
    assert packaging_file.startswith(str(prefix))
    assert glob.glob(f"{prefix}/include/python3.*/Python.h")
