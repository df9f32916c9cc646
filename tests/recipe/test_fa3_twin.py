"""FlashAttention-3's conda-build twin (meta.yaml + conda_build_config.yaml) says what recipe.yaml
says, rendered per row and for a subset as conda-build renders it (conda_build_render.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe
from ruamel.yaml import YAML

from extforge import engine

from .conda_build_render import assert_same_tests, render
from .conda_build_render import v1_pin as _pin

RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn-3"
SUBSETS = [{}, {"fa3_head_dims": "128", "fa3_dtypes": "bf16;fp16", "fa3_features": "bwd;varlen"}]


def _pairs(variant_file: str, subset: dict[str, str], recipe: Path = RECIPE) -> list[tuple[dict, dict]]:
    values, zips = engine.read_variant_files([recipe / variant_file])
    values |= {k: [v] for k, v in subset.items()}
    rendered = Stage0Recipe.from_file(recipe / "recipe.yaml").render(
        engine.variant_config(values, zips), RenderConfig(platform=PlatformConfig(target_platform="linux-64")))
    # The subset keys are out of rattler-build's hash (ignore_keys), so out of its used variant too.
    return [(v.recipe.to_dict(), render(recipe, {k: str(x) for k, x in v.variant.items()} | subset)) for v in rendered]


@pytest.fixture(scope="module", params=[(f, i) for f in ("variants.yaml", "variants-offline.yaml")
                                        for i in range(len(SUBSETS))])
def pairs(request) -> list[tuple[dict, dict]]:
    variant_file, subset = request.param
    return _pairs(variant_file, SUBSETS[subset])


def test_variant_configs_are_the_same_rows() -> None:
    yaml = YAML(typ="safe")
    assert yaml.load(RECIPE / "conda_build_config.yaml") == yaml.load(RECIPE / "variants.yaml")


def test_same_sources_and_build_string(pairs) -> None:
    for v1, meta in pairs:
        assert meta["package"] == {"name": v1["package"]["name"], "version": v1["package"]["version"]}
        assert [(s["url"], s["sha256"], s.get("folder")) for s in meta["source"]] == [
            (s["url"], s["sha256"], s.get("target_directory")) for s in v1["source"]]
        assert re.sub(r"_h[0-9a-f]{7}_", "_hHASH_", v1["build"]["string"]) == re.sub(
            r"_h[0-9a-f]{7}_", "_hHASH_", meta["build"]["string"])
        # A subset is down-prioritized in both: rattler-build's variant priority, conda-build's track feature.
        assert bool(meta["build"].get("track_features")) == bool(v1["build"]["variant"]["down_prioritize_variant"])


def test_same_requirements_environment_and_tests(pairs) -> None:
    for v1, meta in pairs:
        for section in ("build", "host", "run"):
            assert [_pin(d) for d in v1["requirements"][section]] == meta["requirements"][section], section
        meta_env = dict(e.split("=", 1) for e in meta["build"]["script_env"])
        assert {k: v for k, v in meta_env.items() if v} == v1["build"]["script"]["env"]
        assert_same_tests(v1, meta)


def test_twin_detects_drift(tmp_path: Path) -> None:
    for f in RECIPE.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_text(f.read_text())
    meta = tmp_path / "meta.yaml"
    meta.write_text(meta.read_text().replace("- pytorch >=2.9 ", "- pytorch >=2.8 "))
    (v1, drifted), *_ = _pairs("variants-offline.yaml", {}, tmp_path)
    assert [_pin(d) for d in v1["requirements"]["run"]] != drifted["requirements"]["run"]
