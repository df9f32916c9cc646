"""Every recipe of the build layer can become a wheel: each run requirement its package will carry
has a PyPI name or is one a venv meets another way, with the reason; a requirement on another
package extforge builds per torch (mamba-ssm's on causal-conv1d) is pinned to the version of the
wheel's own index row. The old code passed any name it did not know to the wheel as it was (a
conda-only name pip cannot find, or one PyPI holds as something else) and required
`causal-conv1d>=1.2.0`, which pip would meet with PyPI's source or a newer release built for no
torch at all."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from crafted_ext import DEPENDS, MODULE, SITE, TORCH_PIN, extension, torch_env, torch_package
from packaging.requirements import Requirement
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

from extforge.errors import ExtforgeError
from extforge.wheel.publish import publish_conda_wheels
from extforge.wheel.requirements import Dep, Dropped, pypi_names, pypi_requirement, requires_dist, torch_dep
from security.crafted import craft_package, member

RECIPES = Path(__file__).resolve().parents[2] / "recipe"
ROW = "torch2.14.1-cu130"
CAUSAL_CONV1D = "1.7.0+cu130torch2.14cxx11abiTRUE"
# What a build adds to a recipe's run requirements: pytorch's run export (its exact build), the
# interpreter's, the audit's glibc floor, and conda-forge's compilers' (the mirror's add none).
RUN_EXPORTS = [TORCH_PIN, "python_abi 3.11.* *_cp311", "__glibc >=2.28,<3.0.a0", "libgcc >=14", "libstdcxx >=14",
               "cuda-cudart >=13.0,<14.0a0"]
# Each recipe's wheel requirements, torch's first.
EXPECTED = {
    "causal-conv1d": ["torch==2.14.1", "packaging"],
    "demo-ext": ["torch==2.14.1"],
    "flash-attn": ["torch==2.14.1", "einops"],
    "flash-attn-3": ["torch>=2.9"],
    "gsplat": ["torch==2.14.1", "numpy", "rich>=12", "packaging", "typing_extensions"],
    "mamba-ssm": ["torch==2.14.1", "causal-conv1d==1.7.0", "triton>=3.5.0", "einops", "transformers", "packaging"],
    "torch-cluster": ["torch==2.14.1", "scipy"],
    "torch-scatter": ["torch==2.14.1"],
}


def _run_requirements(recipe: Path) -> list[str]:
    """The recipe's run requirements, rendered for the mirror channel's row (python 3.11, torch
    2.14.1, CUDA 13.0); pin_compatible as a build turns it into a range."""
    variants = VariantConfig({"python": ["3.11"], "pytorch": ["2.14.1"], "cuda_compiler_version": ["13.0"],
                              "cuda_archs": ["9.0"]})
    (rendered,) = Stage0Recipe.from_file(recipe / "recipe.yaml").render(
        variants, RenderConfig(platform=PlatformConfig(target_platform="linux-64")))
    run = rendered.recipe.to_dict()["requirements"]["run"]
    return [f"{r['pin_compatible']['name']} >=13.0,<14.0a0" if isinstance(r, dict) else r for r in run]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_run_requirement_of_every_recipe_maps_to_pypi_or_is_dropped_with_its_reason(name: str) -> None:
    depends = _run_requirements(RECIPES / name) + [d for d in RUN_EXPORTS if name != "flash-attn-3" or "pytorch" not in d]
    served = {"causal-conv1d": [CAUSAL_CONV1D]}
    for dep in map(Dep.parse, depends):
        line = pypi_requirement(dep, name, ROW, served)
        assert isinstance(line, str) and Requirement(line) or isinstance(line, Dropped) and line.reason, dep
    assert requires_dist(depends, torch_dep(depends, name), name, ROW, served) == EXPECTED[name]


def test_the_data_knows_every_recipe_as_built_per_torch() -> None:
    """A recipe added to the build layer without its line would have its dependents' wheels
    require whatever PyPI holds under its name."""
    assert {p.parent.name for p in RECIPES.glob("*/recipe.yaml")} <= pypi_names().per_torch


def test_a_name_the_data_does_not_know_is_refused_naming_it_and_the_data_file() -> None:
    with pytest.raises(ExtforgeError) as err:
        requires_dist([*DEPENDS, "libconda-only >=1"], torch_dep(DEPENDS, "x"), "demo-x", ROW, {})
    assert "libconda-only of demo-x has no known PyPI name" in err.value.what
    assert "data/pypi-names.yaml" in err.value.fix and err.value.exit_code == 1


def test_a_package_built_per_torch_is_pinned_to_the_version_its_row_serves() -> None:
    """`==1.7.0` matches the row's `1.7.0+cu130torch2.14cxx11abiTRUE` (PEP 440 leaves a candidate's
    local label out of a specifier without one), and PyPI's sdist of a later release never."""
    dep = Dep.parse("causal-conv1d >=1.2.0")
    served = {"causal-conv1d": ["1.1.0+cu130torch2.14cxx11abiTRUE", CAUSAL_CONV1D, "not a version"]}
    line = pypi_requirement(dep, "mamba-ssm", ROW, served)
    assert line == "causal-conv1d==1.7.0"
    assert Requirement(line).specifier.contains(CAUSAL_CONV1D) and not Requirement(line).specifier.contains("1.8.0")
    for nothing in ({}, {"causal-conv1d": ["1.1.0+cu130torch2.14cxx11abiTRUE"]}):
        with pytest.raises(ExtforgeError) as err:
            pypi_requirement(dep, "mamba-ssm", ROW, nothing)
        assert err.value.what == f"mamba-ssm requires causal-conv1d >=1.2.0, and the wheel index row {ROW} serves no wheel of it"
        assert "extforge publish --wheels" in err.value.fix


def _package(tmp: Path, env: Path, name: str, version: str, depends: list[str]) -> Path:
    module = extension(tmp / name, env)
    folder = name.replace("-", "_")
    members = [member(f"{SITE}/{folder}/__init__.py", b"from . import _C\n"), member(f"{SITE}/{folder}/{MODULE}", module, 0o755),
               member(f"share/extforge/audit/{name}.json",
                      json.dumps({"schema": 1, "name": name, "version": version, "cxx11_abi": True, "verdict": "pass"}).encode())]
    return craft_package(tmp / "pkgs", name, members, version=version, build="cuda130_torch214_py311_cxx11_h1234567_0",
                         subdir="linux-64", index={"depends": depends})


def _requires(index: Path, entry: dict) -> list[str]:
    with zipfile.ZipFile(index / entry["file"]) as zf:
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return [line.split(": ", 1)[1] for line in zf.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]


def test_publish_pins_a_dependency_to_the_wheel_of_the_same_row_published_before_or_beside(tmp_path: Path) -> None:
    """mamba-ssm named before causal-conv1d in one publish is made after it; published alone into
    an index without causal-conv1d it is refused, into one holding it (a publish before) pinned."""
    from extforge.publishing.index import index_channel

    channel = tmp_path / "torch-channel"
    torch_package(channel)
    index_channel(channel)
    env = torch_env(tmp_path)
    depends = [d for d in DEPENDS if not d.startswith("__")]
    mamba = _package(tmp_path, env, "mamba-ssm", "2.3.2.post1", [*depends, "causal-conv1d >=1.2.0"])
    causal = _package(tmp_path, env, "causal-conv1d", "1.7.0", depends)
    together = tmp_path / "together"
    result = publish_conda_wheels([mamba, causal], together, upstream=[str(channel)], audit=False)
    assert [w.file.split("/")[2] for w in result.wheels] == ["causal-conv1d", "mamba-ssm"]
    assert _requires(together, result.to_json()["wheels"][1]) == ["torch==2.14.1", "einops>=0.6", "causal-conv1d==1.7.0"]

    apart = tmp_path / "apart"
    with pytest.raises(ExtforgeError, match=f"the wheel index row {ROW} serves no wheel of it"):
        publish_conda_wheels([mamba], apart, upstream=[str(channel)], audit=False)
    assert not (apart / ROW).exists()
    publish_conda_wheels([causal], apart, upstream=[str(channel)], audit=False)
    (entry,) = publish_conda_wheels([mamba], apart, upstream=[str(channel)], audit=False).to_json()["wheels"]
    assert _requires(apart, entry)[-1] == "causal-conv1d==1.7.0"
