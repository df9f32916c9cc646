"""recipe/gsplat, an extension whose PyPI wheel compiles its kernels at first use: the recipe
renders for every channel row we serve with the ahead-of-time build asked for, its conda-build twin
(meta.yaml) says the same, and its tests fail a package whose kernels gsplat would compile on the
node instead (no build, no GPU)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from extforge import engine
from extforge.mirror import rows
from extforge.recipes import build_layer

from .conda_build_render import render, v1_pin

RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "gsplat"
# The rows of the channels we serve (recipe/flash-attn/variants-offline.yaml's machines), as
# `extforge mirror` writes them into a channel's variants.yaml.
SERVED = [("3.11", "2.14.1", "13.0", "12", "cxx11"), ("3.12", "2.11.0", "13.0", "13", "cxx11"),
          ("3.10", "2.9.1", "12.4", "12", "cxx11"), ("3.12", "2.9.1", "12.4", "12", "cxx11"),
          ("3.12", "2.6.0", "12.4", "12", "cxx98")]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[tuple[dict, dict]]:
    channel = tmp_path_factory.mktemp("channel") / "variants.yaml"
    channel.write_text(rows.variants_yaml([
        rows.Row({"python": py, "pytorch": torch, "cxx_abi": abi, "c_compiler": "gcc", "c_compiler_version": gcc,
                  "cxx_compiler": "gxx", "cxx_compiler_version": gcc, "cuda_compiler": "cuda-nvcc",
                  "cuda_compiler_version": cuda}) for py, torch, cuda, gcc, abi in SERVED]))
    # What `extforge build` reads: the layer's variants (the archs), the channel's rows, and the
    # build string the recipe inherits.
    config = engine.load_variant_files([build_layer.variants_file(), channel])
    return [(v.variant, v.recipe.to_dict())
            for v in engine.render(RECIPE / "recipe.yaml", config, "linux-64", build_layer.BUILD_STRING)]


def test_one_package_per_served_row_named_by_it(rendered) -> None:
    assert sorted((v["python"], v["pytorch"], v["cxx_abi"]) for v, _ in rendered) == sorted((r[0], r[1], r[4]) for r in SERVED)
    strings = [r["build"]["string"] for _, r in rendered]
    assert len(set(strings)) == len(SERVED)
    for (variant, recipe), string in zip(rendered, strings, strict=True):
        torch = "".join(variant["pytorch"].split(".")[:2])
        assert string.startswith(f"cuda{variant['cuda_compiler_version'].replace('.', '')}_torch{torch}_"
                                 f"py{variant['python'].replace('.', '')}_{variant['cxx_abi']}_h"), string
        assert "extforge-torch-build" in recipe["requirements"]["build"]


def test_the_kernels_are_compiled_in_the_build_for_the_variants_archs(rendered) -> None:
    for _, recipe in rendered:
        env = recipe["build"]["script"]["env"]
        assert env["BUILD_NO_CUDA"] == "0" and env["TORCH_CUDA_ARCH_LIST"] == "9.0"


def test_the_conda_build_twin_says_the_same_for_every_row(rendered) -> None:
    yaml = YAML(typ="safe")
    assert yaml.load(RECIPE / "conda_build_config.yaml") == yaml.load(build_layer.variants_file())
    for variant, v1 in rendered:
        meta = render(RECIPE, {k: str(v) for k, v in variant.items()})
        assert meta["package"] == {"name": v1["package"]["name"], "version": v1["package"]["version"]}
        assert (meta["source"]["url"], meta["source"]["sha256"]) == (v1["source"][0]["url"], v1["source"][0]["sha256"])
        assert re.sub(r"_h[0-9a-f]{7}_", "_hHASH_", meta["build"]["string"]) == re.sub(
            r"_h[0-9a-f]{7}_", "_hHASH_", v1["build"]["string"])
        assert dict(e.split("=", 1) for e in meta["build"]["script_env"]) == v1["build"]["script"]["env"]
        for section in ("build", "host", "run"):
            assert meta["requirements"][section] == [v1_pin(d) for d in v1["requirements"][section]], section
        (imports,) = [t["python"]["imports"] for t in v1["tests"] if "python" in t]
        assert meta["test"]["imports"] == imports
        assert meta["test"]["commands"] == [t["script"] for t in v1["tests"] if "script" in t]


def _script_test(recipe: dict) -> list[str]:
    (script,) = [t["script"] for t in recipe["tests"] if "script" in t]
    return shlex.split(script if isinstance(script, str) else "\n".join(script))


def _installed(root: Path, *, compiled: bool) -> Path:
    """A stand-in for the installed package: `gsplat.cuda._backend` as upstream's loads its kernels
    (the compiled `gsplat.csrc`, else a compile at first use, None here: the test env has no nvcc)."""
    (root / "gsplat" / "cuda").mkdir(parents=True)
    (root / "gsplat" / "__init__.py").write_text("")
    (root / "gsplat" / "cuda" / "__init__.py").write_text("")
    (root / "gsplat" / "cuda" / "_backend.py").write_text(
        "try:\n    from gsplat import csrc as _C\nexcept ImportError:\n    _C = None\n")
    if compiled:
        (root / "gsplat" / "csrc.py").write_text("")
    return root


@pytest.mark.parametrize("compiled", [True, False])
def test_the_package_test_fails_where_gsplat_would_compile_at_first_use(rendered, tmp_path: Path,
                                                                        compiled: bool) -> None:
    _, recipe = rendered[0]
    (imports,) = [t["python"]["imports"] for t in recipe["tests"] if "python" in t]
    assert "gsplat.csrc" in imports
    python, *args = _script_test(recipe)
    assert python == "python"
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(_installed(tmp_path, compiled=compiled))})
    assert (proc.returncode == 0) is compiled, proc.stderr
