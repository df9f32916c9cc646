"""recipe/flash-attn/recipe.yaml renders for every variant of both variant files (no build)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

from extforge.recipes import build_layer

VARIANT_FILES = ["variants.yaml", "variants-offline.yaml"]
BUILD_STRING = re.compile(r"^cuda(\d+)_torch(\d+)_py(\d+)_cxx(?:11|98)_h[0-9a-f]{7}_(\d+)$")


def _render(recipe_dir: Path, variant_file: str) -> list[tuple[dict, dict]]:
    recipe = Stage0Recipe.from_file(recipe_dir / "recipe.yaml")
    variants = recipe.render(
        VariantConfig.from_file(recipe_dir / variant_file),
        RenderConfig(platform=PlatformConfig(target_platform="linux-64")),
    )
    return [(v.variant, v.recipe.to_dict()) for v in variants]


@pytest.fixture(scope="module", params=VARIANT_FILES)
def rendered(request, recipe_dir: Path) -> list[tuple[dict, dict]]:
    return _render(recipe_dir, request.param)


def _zip_rows(recipe_dir: Path, variant_file: str) -> int:
    config = VariantConfig.from_file(recipe_dir / variant_file)
    return len(config.get_values("python"))


@pytest.mark.parametrize("variant_file", VARIANT_FILES)
def test_one_rendered_variant_per_row(recipe_dir: Path, variant_file: str) -> None:
    assert len(_render(recipe_dir, variant_file)) == _zip_rows(recipe_dir, variant_file) >= 2


def test_build_strings_name_the_variant_and_are_distinct(rendered) -> None:
    strings = [r["build"]["string"] for _, r in rendered]
    assert len(set(strings)) == len(strings), strings
    for variant, r in rendered:
        m = BUILD_STRING.match(r["build"]["string"])
        assert m, r["build"]["string"]
        cuda, torch, py, number = m.groups()
        assert cuda == variant["cuda_compiler_version"].replace(".", "")
        assert torch == "".join(variant["pytorch"].split(".")[:2])
        assert py == "".join(variant["python"].split(".")[:2])
        assert int(number) == r["build"]["number"]


def test_pytorch_pinned_to_one_exact_build(rendered) -> None:
    for variant, r in rendered:
        host = r["requirements"]["host"]
        # Host: exactly the variant's torch release, a CUDA build of it; its run_exports pin the
        # package to the exact build the host solve picked (the mirror's pytorch exports it,
        # tests/mirror/test_conda_writer.py), as every recipe of the layer gets it.
        assert f"pytorch {variant['pytorch']}.* cuda*" in host
        run = r["requirements"]["run"]
        pins = [d["pin_compatible"] for d in run if isinstance(d, dict) and "pin_compatible" in d]
        assert not any(p["name"] == "pytorch" for p in pins) and "ignore_run_exports" not in r["requirements"]
        assert f"cuda-version {variant['cuda_compiler_version']}.*" in host
        assert any(p["name"] == "cuda-version" for p in pins)
        cuda_major = variant["cuda_compiler_version"].split(".")[0]
        assert f"__cuda >={cuda_major}" in run


def test_the_layer_builds_it_for_the_variants_archs(rendered) -> None:
    """The recipe set EXTFORGE_LAYER=files (the layer's activation returned at once), passed its
    archs in flash-attn's own FLASH_ATTN_CUDA_ARCHS and the planner's and compile cache's settings
    one by one; the layer does all that now, for the archs of cuda_archs."""
    for variant, r in rendered:
        env = r["build"]["script"]["env"]
        assert env == {"TORCH_CUDA_ARCH_LIST": variant["cuda_archs"], "FLASH_ATTN_HEAD_DIMS": "all"}
        assert "extforge-torch-build" in r["requirements"]["build"]
        assert r["build"]["script"]["file"] == "build.sh"
    # Upstream's download switch is the layer's data, set in every build.
    assert "export FLASH_ATTENTION_FORCE_BUILD=TRUE" in build_layer.switches_sh()


def test_default_archs_cover_a100_and_h100(recipe_dir: Path) -> None:
    for _, r in _render(recipe_dir, "variants.yaml"):
        assert {"8.0", "9.0"} <= set(r["build"]["script"]["env"]["TORCH_CUDA_ARCH_LIST"].split(";"))


def test_source_is_the_pinned_sdist_with_offline_cache_first(rendered) -> None:
    for _, r in rendered:
        (source,) = r["source"]
        assert source["sha256"] == "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
        local, pypi = source["url"]
        assert local.startswith("file://") and local.endswith(
            "/sha256/1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d/flash_attn-2.8.3.tar.gz"
        )
        assert pypi.startswith("https://files.pythonhosted.org/packages/") and pypi.endswith("/flash_attn-2.8.3.tar.gz")


def test_source_cache_location_comes_from_environment(recipe_dir: Path, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EXTFORGE_SOURCES", str(tmp_path))
    (_, r), *_ = _render(recipe_dir, "variants-offline.yaml")
    assert r["source"][0]["url"][0].startswith(f"file://{tmp_path}/sha256/")


def test_recipe_tests_check_import_extension_and_wheel_tag(rendered, recipe_dir: Path) -> None:
    _, r = rendered[0]
    kinds = {next(iter(t)): t[next(iter(t))] for t in r["tests"]}
    assert any("flash_attn_2_cuda" in f and f.endswith(".so") for f in kinds["package_contents"]["files"])
    assert "check_package.py" in str(kinds["script"])
    script = (recipe_dir / "check_package.py").read_text()
    assert "none-any" in script
    # The one test env imports the package (no separate python test: one env, one torch import).
    imported = {a.name for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Import) for a in node.names}
    assert {"flash_attn", "flash_attn_2_cuda"} <= imported


def test_head_dim_subset_is_named_and_down_prioritised(recipe_dir: Path, tmp_path: Path) -> None:
    """`flash_attn_head_dims` builds a subset: its build string says which head dims, it carries a
    track feature (a plain `flash-attn` request prefers the full build), and the build script
    gets the list; without the key every head dim is built, undecorated."""
    full = _render(recipe_dir, "variants-offline.yaml")
    variants = tmp_path / "variants.yaml"
    variants.write_text((recipe_dir / "variants-offline.yaml").read_text() + 'flash_attn_head_dims:\n  - "64;128"\n')
    recipe = Stage0Recipe.from_file(recipe_dir / "recipe.yaml")
    slim = [(v.variant, v.recipe.to_dict()) for v in recipe.render(
        VariantConfig.from_file(variants), RenderConfig(platform=PlatformConfig(target_platform="linux-64")))]
    assert len(slim) == len(full)
    for (_, f), (_, s) in zip(full, slim):
        assert BUILD_STRING.match(f["build"]["string"]) and not re.search(r"_hd\d+(-\d+)*_", f["build"]["string"])
        assert f["build"]["variant"]["down_prioritize_variant"] == 0
        assert f["build"]["script"]["env"]["FLASH_ATTN_HEAD_DIMS"] == "all"
        assert re.match(r"^cuda\d+_torch\d+_py\d+_hd64_128_cxx(?:11|98)_h[0-9a-f]{7}_0$", s["build"]["string"])
        assert s["build"]["variant"]["down_prioritize_variant"] == 1
        assert s["build"]["script"]["env"]["FLASH_ATTN_HEAD_DIMS"] == "64;128"
