"""The foundation end to end: mirror → build demo-ext → solve + install with rattler → import.

Also the bad inputs: a missing recipe, a variant the channel cannot satisfy, a mirror input
without torch. Each must be one ExtforgeError paragraph (exit code 2 from the CLI).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge import paths
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.errors import ExtforgeError
from extforge.machine import detect
from package_files import package_member

REPO = Path(__file__).resolve().parents[2]


def _channel_record(channel: Path, name: str) -> dict:
    data = json.loads((channel / "linux-64" / "repodata.json").read_text())
    return next(r for r in data["packages.conda"].values() if r["name"] == name)


@pytest.mark.slow
def test_demo_package_pins_the_exact_pytorch_it_was_built_against(demo_package: Path, mirror_channel: Path):
    index = json.loads(package_member(demo_package, "info/index.json"))
    torch = _channel_record(mirror_channel, "pytorch")
    assert re.fullmatch(r"cuda130_torch214_py311_cxx11_h[0-9a-f]{7}_0", index["build"]), index["build"]
    assert f"pytorch =={torch['version']} {torch['build']}" in index["depends"]
    assert torch["build"].startswith("cuda130_py311_")
    # The python pin comes from the mirrored python's run_exports, as with conda-forge's python_abi.
    assert any(d.startswith("python_abi 3.11") for d in index["depends"])
    assert oct(demo_package.stat().st_mode & 0o777) == "0o644"


@pytest.mark.slow
def test_demo_package_was_audited_against_its_build_env(demo_package: Path, demo_channel: Path):
    stamp = json.loads(package_member(demo_package, "share/extforge/audit/demo-ext.json"))
    assert stamp["audited_against"] == "build", stamp
    assert stamp["verdict"] == "pass" and stamp["sass_archs"] and stamp["torch"].startswith("2.14.1")
    # The work folder (sources, objects, host env) lived only until the audit.
    assert not list((demo_channel / "bld").glob("rattler-build_*"))


@pytest.mark.slow
def test_demo_package_records_what_the_build_layer_enforced(demo_package: Path):
    build = json.loads(package_member(demo_package, "share/extforge/build/demo-ext.json"))
    # torch 2.14.1's ATen/ATen.h refuses anything older than C++20.
    assert build["cxx_std"] == "c++20" and build["cxx11_abi"] is True and build["torch"].startswith("2.14.1")
    assert build["layer"] == "extforge-torch-build" and build["network"] in ("namespace", "proxy")
    # setup.py hard-codes sm_75 beside sm_90 (as causal-conv1d does): replaced by the variant's list,
    # and the package carries exactly that (the audit fails any other arch).
    assert build["cuda_archs"] == ["sm_90"]
    assert "arch: -gencode arch=compute_75,code=sm_75" in build["upstream_flags_replaced"]
    stamp = json.loads(package_member(demo_package, "share/extforge/audit/demo-ext.json"))
    assert stamp["sass_archs"] == ["sm_90"] and not stamp.get("ptx_archs"), stamp
    assert package_member(demo_package, "share/extforge/build/demo-ext.ninja_log").startswith(b"# ninja log")


@pytest.mark.slow
def test_demo_installs_from_the_channels_and_imports(demo_channel: Path, mirror_channel: Path, tmp_path: Path):
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version, install, solve

    def vp(name: str, version: str) -> GenericVirtualPackage:
        return GenericVirtualPackage(PackageName(name), Version(version), BuildString("0"))

    # This machine's glibc: demo-ext requires the floor its audit found here (`__glibc >=2.32,<3.0.a0`).
    virtual = [vp("__unix", "0"), vp("__linux", "5.15"), vp("__glibc", str(detect().glibc)), vp("__cuda", "13.0")]
    channels = [demo_channel.resolve().as_uri(), mirror_channel.resolve().as_uri()]
    prefix = tmp_path / "env"

    async def solve_install() -> list:
        records = await solve(channels, ["demo-ext"], platforms=["linux-64", "noarch"], virtual_packages=virtual)
        await install(records, target_prefix=prefix, cache_dir=paths.rattler_pkgs_dir(), show_progress=False)
        return records

    records = asyncio.run(solve_install())
    assert {"demo-ext", "pytorch", "python"} <= {r.name.normalized for r in records}
    out = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import demo_ext, torch; print(demo_ext.rms_norm.__doc__.split()[0], torch.__version__)"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RMSNorm", "2.14.1+cu130"]


@pytest.mark.slow
def test_a_variant_the_channel_cannot_satisfy_names_the_spec(mirror_channel: Path, tmp_path: Path):
    with pytest.raises(ExtforgeError) as err:
        build_recipe(BuildOptions.make(
            REPO / "recipe" / "demo-ext", [mirror_channel], tmp_path / "out", variants={"python": ["3.9"]}, test=False
        ))
    assert "python 3.9" in err.value.what
    assert "Failed to resolve" not in err.value.what
    # Refused before rattler-build runs: nothing is written into the output folder.
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())


def test_missing_recipe_path_is_one_paragraph(tmp_path: Path):
    proc = run_extforge("build", str(tmp_path / "no-such-recipe"), "--channel", str(tmp_path), "--output-dir", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "error: no recipe at" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_mirror_input_without_torch_says_what_to_do(tmp_path: Path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "tiny-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("tiny/__init__.py", "")
        zf.writestr("tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
        zf.writestr("tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
    proc = run_extforge("mirror", "--channel", str(tmp_path / "ch"), "--from-wheels", str(wheels), "--json")
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["error"].startswith("there is no torch in")
    assert "install torch" in proc.stderr


@pytest.mark.slow
def test_a_passed_build_leaves_no_test_environment(demo_channel: Path):
    """rattler-build tests a package in a fresh environment (a torch one is ~5 GB of copies, not
    links); once the tests passed it has nothing left to show, so the output folder does not keep it."""
    assert (demo_channel / "linux-64").is_dir()
    assert not list((demo_channel / "test").glob("test_*"))
