"""The mirrored pytorch asks for a driver of its CUDA major: a cu130 torch is not installable
where the driver offers CUDA 12 (conda and pixi read __cuda from index.json)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extforge.mirror.recipes import PackageJob
from extforge.mirror.torch_pkg import TorchFacts, as_pytorch


def _job() -> PackageJob:
    return PackageJob(name="pytorch", version="2.9.1", build_string="", depends=["python"], identity="x")


@pytest.mark.parametrize(("version", "cuda", "want"), [("2.9.1+cu128", "12.8", "__cuda >=12"), ("2.14.1+cu130", "13.0", "__cuda >=13")])
def test_cuda_torch_depends_on_its_driver_major(version, cuda, want):
    depends = as_pytorch(_job(), TorchFacts(version, cuda), "3.12").depends
    assert [d for d in depends if d.startswith("__cuda")] == [want]


def test_cpu_torch_needs_no_driver():
    assert not [d for d in as_pytorch(_job(), TorchFacts("2.13.0+cpu", None), "3.12").depends if d.startswith("__")]


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
