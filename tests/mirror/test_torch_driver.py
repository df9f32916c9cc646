"""The mirrored pytorch asks for a driver of its CUDA major: a cu130 torch is not installable
where the driver offers CUDA 12 (conda and pixi read __cuda from index.json)."""

from __future__ import annotations

import asyncio
import zipfile
from pathlib import Path

import pytest

from extforge.mirror.recipes import PackageJob, exact_self_pin
from extforge.mirror.torch_pkg import NUMPY_SPEC, TorchFacts, as_pytorch


def _job() -> PackageJob:
    return PackageJob(name="pytorch", version="2.9.1", build_string="", depends=["python"], identity="x")


@pytest.mark.parametrize(("version", "cuda", "want"), [("2.9.1+cu128", "12.8", "__cuda >=12"), ("2.14.1+cu130", "13.0", "__cuda >=13")])
def test_cuda_torch_depends_on_its_driver_major(version, cuda, want):
    depends = as_pytorch(_job(), TorchFacts(version, cuda), "3.12").depends
    assert [d for d in depends if d.startswith("__cuda")] == [want]


def test_an_extension_built_against_it_is_pinned_to_this_exact_torch():
    """Every recipe wrote `pin_compatible('pytorch', exact=True)` itself; the mirror's pytorch exports
    that pin (version and build string), as conda-forge's exports its own minor pin."""
    assert as_pytorch(_job(), TorchFacts("2.14.1+cu130", "13.0"), "3.11").run_exports == [exact_self_pin("pytorch")]


def test_cpu_torch_needs_no_driver():
    assert not [d for d in as_pytorch(_job(), TorchFacts("2.13.0+cpu", None), "3.12").depends if d.startswith("__")]


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
        zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")


@pytest.mark.parametrize("with_numpy", [True, False])
def test_pytorch_requires_numpy_as_on_conda_forge(tmp_path: Path, with_numpy: bool):
    """pip's torch does not require numpy, conda-forge's pytorch does: the channel's pytorch asks
    for the numpy it holds, and a source without numpy says it is missing."""
    from extforge import mirror
    from extforge.mirror.toolchain import detect

    _wheel(tmp_path, "torch", "2.13.0", {"torch/version.py": "__version__ = '2.13.0+cpu'\ncuda = None\n"})
    if with_numpy:
        _wheel(tmp_path, "numpy", "2.4.6", {"numpy/__init__.py": ""})
    jobs, _, missing = mirror.plan_jobs(mirror.from_wheels(tmp_path), [], detect())
    (torch,) = [j for j in jobs if j.name == "pytorch"]
    assert (NUMPY_SPEC in torch.depends) is with_numpy
    assert ("numpy" in {j.name for j in jobs}) is with_numpy
    assert ("numpy" in missing) is not with_numpy
    assert "numpy" in mirror.pip_requirements("torch==2.13.0", [])


@pytest.mark.slow
def test_mirrored_pytorch_index_json_names_the_driver_major(mirror_channel: Path):
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version, solve
    from rattler.package import IndexJson

    (pkg,) = sorted((mirror_channel / "linux-64").glob("pytorch-*.conda"))
    index = IndexJson.from_package_archive(pkg)
    assert str(index.build).startswith("cuda130_") and "__cuda >=13" in index.depends, index.depends

    def solvable_with(driver: str) -> bool:
        virtual = [GenericVirtualPackage(PackageName(n), Version(v), BuildString("0"))
                   for n, v in (("__unix", "0"), ("__linux", "5.15"), ("__glibc", "2.36"), ("__cuda", driver))]
        try:
            asyncio.run(solve([mirror_channel.as_uri()], ["pytorch"], platforms=["linux-64", "noarch"], virtual_packages=virtual))
        except Exception:  # rattler's SolverError
            return False
        return True

    assert solvable_with("13.0") and not solvable_with("12.8")
