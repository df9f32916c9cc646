"""The conda-build twin (meta.yaml + conda_build_config.yaml) says what recipe.yaml says.

conda-build cannot run here, so meta.yaml is rendered per variant row as conda-build renders it
(conda_build_render.py: its Jinja context, its render-time PKG_HASH placeholder, its dependency
hash computed from the variables the recipe uses) and compared with rattler-build's rendering of
recipe.yaml, for conda-forge's rows (variants.yaml) and the mirror's own (variants-offline.yaml).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig
from ruamel.yaml import YAML

from .conda_build_render import RENDER_PKG_HASH, assert_same_tests, dependency_hash, render
from .conda_build_render import v1_pin as _v1_pin

VARIANT_FILES = ("variants.yaml", "variants-offline.yaml")


def _render_v1(recipe_dir: Path, variants: str = "variants.yaml") -> list[tuple[dict, dict]]:
    recipe = Stage0Recipe.from_file(recipe_dir / "recipe.yaml")
    rendered = recipe.render(
        VariantConfig.from_file(recipe_dir / variants),
        RenderConfig(platform=PlatformConfig(target_platform="linux-64")),
    )
    return [(v.variant, v.recipe.to_dict()) for v in rendered]


@pytest.fixture(scope="module", params=VARIANT_FILES)
def pairs(recipe_dir: Path, request) -> list[tuple[dict, dict, dict]]:
    out = []
    for variant, v1 in _render_v1(recipe_dir, request.param):
        meta = render(recipe_dir, {k: str(v) for k, v in variant.items()})
        out.append((variant, v1, meta))
    return out


def test_variant_configs_are_the_same_rows(recipe_dir: Path) -> None:
    yaml = YAML(typ="safe")
    assert yaml.load(recipe_dir / "conda_build_config.yaml") == yaml.load(recipe_dir / "variants.yaml")


def test_same_package_and_source(pairs) -> None:
    for _, v1, meta in pairs:
        assert meta["package"] == {"name": v1["package"]["name"], "version": v1["package"]["version"]}
        assert meta["source"]["sha256"] == v1["source"][0]["sha256"]
        assert meta["source"]["url"] == v1["source"][0]["url"]


def test_same_build_string_scheme(pairs) -> None:
    for _, v1, meta in pairs:
        assert re.sub(r"_h[0-9a-f]{7}_", "_hHASH_", v1["build"]["string"]) == re.sub(
            r"_h[0-9a-f]{7}_", "_hHASH_", meta["build"]["string"]
        )
        assert meta["build"]["number"] == v1["build"]["number"]


def test_build_string_carries_conda_builds_dependency_hash(pairs) -> None:
    hashes, strings = set(), set()
    for variant, _, meta in pairs:
        inputs = meta["extra"]["hash_inputs"]
        # What conda-build hashes for this recipe: the pins it uses, not python (in the string).
        assert inputs["pytorch"] == str(variant["pytorch"]) and inputs["__cuda"].startswith("__cuda >=")
        assert {"cuda_compiler_version", "cxx_compiler_version", "cuda_archs", "target_platform"} <= set(inputs)
        assert "python" not in inputs
        real = dependency_hash(inputs)
        assert re.fullmatch(r"h[0-9a-f]{7}", real) and real != "h" + RENDER_PKG_HASH
        assert meta["build"]["string"].endswith(f"_{real}_0") and RENDER_PKG_HASH not in meta["build"]["string"]
        hashes.add(real)
        strings.add(meta["build"]["string"])
    # Every row its own package name; rows apart only in python share the hash (py tag differs).
    assert len(strings) == len(pairs)
    assert len(hashes) == len({tuple(sorted((k, str(v)) for k, v in variant.items() if k != "python")) for variant, _, _ in pairs})


def test_same_requirements(pairs) -> None:
    for _, v1, meta in pairs:
        for section in ("build", "host", "run"):
            assert [_v1_pin(d) for d in v1["requirements"][section]] == meta["requirements"][section], section


def test_same_build_environment(pairs) -> None:
    for _, v1, meta in pairs:
        meta_env = dict(e.split("=", 1) for e in meta["build"]["script_env"])
        meta_env = {k: v for k, v in meta_env.items() if v}  # rattler-build drops empty values
        assert meta_env == v1["build"]["script"]["env"]


def test_same_tests(pairs) -> None:
    for _, v1, meta in pairs:
        assert_same_tests(v1, meta)


def _copy(recipe_dir: Path, dest: Path) -> Path:
    for name in ("meta.yaml", "recipe.yaml", *VARIANT_FILES, "build.sh", "check_package.py"):
        (dest / name).write_text((recipe_dir / name).read_text())
    return dest / "meta.yaml"


def test_twin_detects_drift(recipe_dir: Path, tmp_path: Path) -> None:
    """A changed pin in meta.yaml alone is caught (the comparison is not vacuous)."""
    meta = _copy(recipe_dir, tmp_path)
    meta.write_text(meta.read_text().replace("pin_compatible('cuda-version', min_pin='x.x', max_pin='x')",
                                             "pin_compatible('cuda-version', min_pin='x.x', max_pin='x.x')"))
    (variant, v1), *_ = _render_v1(tmp_path)
    drifted = render(tmp_path, {k: str(v) for k, v in variant.items()})
    assert [_v1_pin(d) for d in v1["requirements"]["run"]] != drifted["requirements"]["run"]


def test_twin_detects_the_failures_conda_build_showed(recipe_dir: Path, tmp_path: Path) -> None:
    """The two ways meta.yaml rendered wrong under conda-build are caught by this rendering."""
    meta = _copy(recipe_dir, tmp_path)
    text = meta.read_text()
    # The hash without its "h": conda-build keeps the render-time placeholder in the package name.
    meta.write_text(text.replace("_h{{ PKG_HASH }}_", "_{{ PKG_HASH }}_"))
    (variant, _), *_ = _render_v1(tmp_path)
    assert f"_{RENDER_PKG_HASH}_" in render(tmp_path, {k: str(v) for k, v in variant.items()})["build"]["string"]
    # stdlib('c') without its guard: on the mirror's rows (no c_stdlib) it asks for `c_linux-64`.
    meta.write_text(text.replace("    {% if c_stdlib is defined %}\n", "").replace(
        "    - {{ stdlib('c') }}\n    {% endif %}\n", "    - {{ stdlib('c') }}\n"))
    (variant, v1), *_ = _render_v1(tmp_path, "variants-offline.yaml")
    build = render(tmp_path, {k: str(v) for k, v in variant.items()})["requirements"]["build"]
    assert "c_linux-64" in build and build != [_v1_pin(d) for d in v1["requirements"]["build"]]
