"""The conda-build twin (meta.yaml + conda_build_config.yaml) says what recipe.yaml says.

conda-build cannot run here, so meta.yaml is rendered with jinja2 and stubs for conda-build's
jinja functions, per variant row, and compared with rattler-build's rendering of recipe.yaml.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import jinja2
import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig
from ruamel.yaml import YAML

COMPILER = {"c": "gcc", "cxx": "gxx", "cuda": "cuda-nvcc"}


def _variant_rows(path: Path) -> list[dict[str, str]]:
    config = VariantConfig.from_file(path)
    return [{k: str(v) for k, v in row.items()} for row in config.combinations()]


def _render_meta(recipe_dir: Path, variant: dict[str, str]) -> dict:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def compiler(lang: str) -> str:
        return f"{COMPILER[lang]}_linux-64 {variant[f'{lang}_compiler_version']}.*"

    def stdlib(lang: str) -> str:
        return f"{variant['c_stdlib']}_linux-64 {variant['c_stdlib_version']}.*"

    def pin_compatible(name: str, **kw) -> str:
        return "pin_compatible " + name + " " + " ".join(f"{k}={v}" for k, v in sorted(kw.items()))

    text = env.from_string((recipe_dir / "meta.yaml").read_text()).render(
        **variant,
        PKG_HASH="h0000000",
        environ={},
        compiler=compiler,
        stdlib=stdlib,
        pin_compatible=pin_compatible,
    )
    return YAML(typ="safe").load(io.StringIO(text))


def _render_v1(recipe_dir: Path) -> list[tuple[dict, dict]]:
    recipe = Stage0Recipe.from_file(recipe_dir / "recipe.yaml")
    variants = recipe.render(
        VariantConfig.from_file(recipe_dir / "variants.yaml"),
        RenderConfig(platform=PlatformConfig(target_platform="linux-64")),
    )
    return [(v.variant, v.recipe.to_dict()) for v in variants]


def _v1_pin(dep: object) -> str:
    if isinstance(dep, dict):
        (kind, args), = dep.items()
        args = dict(args)
        name = args.pop("name")
        # rattler-build spells conda-build's min_pin/max_pin as lower_bound/upper_bound.
        renamed = {{"lower_bound": "min_pin", "upper_bound": "max_pin"}.get(k, k): v for k, v in args.items()}
        return f"{kind} {name} " + " ".join(f"{k}={v}" for k, v in sorted(renamed.items()))
    return str(dep)


@pytest.fixture(scope="module")
def pairs(recipe_dir: Path) -> list[tuple[dict, dict, dict]]:
    out = []
    for variant, v1 in _render_v1(recipe_dir):
        meta = _render_meta(recipe_dir, {k: str(v) for k, v in variant.items()})
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
        # conda-build's PKG_HASH carries the "h"; rattler-build's hash does not.
        assert re.sub(r"_h[0-9a-f]{7}_", "_hHASH_", v1["build"]["string"]) == re.sub(
            r"_h[0-9a-f]{7}_", "_hHASH_", meta["build"]["string"]
        )
        assert meta["build"]["number"] == v1["build"]["number"]


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
        kinds = {next(iter(t)): t[next(iter(t))] for t in v1["tests"]}
        assert meta["test"]["imports"] == kinds["python"]["imports"]
        commands = "\n".join(meta["test"]["commands"])
        for pattern in kinds["package_contents"]["files"]:
            # rattler-build's `**/x` glob is a `find ${PREFIX} -path '*/x'` in conda-build's shell.
            as_find = f"find ${{PREFIX}} -path '*/{pattern.removeprefix('**/')}'"
            assert as_find in commands or "${PREFIX}/" + pattern in commands, pattern
        for site_package in kinds["package_contents"].get("site_packages", []):
            assert f"${{SP_DIR}}/{site_package}" in commands
        script_test = next(t for t in v1["tests"] if "script" in t)
        assert script_test["script"] in meta["test"]["commands"]
        assert meta["test"]["files"] == script_test["files"]["recipe"]


def test_twin_detects_drift(recipe_dir: Path, tmp_path: Path) -> None:
    """A changed pin in meta.yaml alone is caught (the comparison is not vacuous)."""
    for name in ("meta.yaml", "recipe.yaml", "variants.yaml", "build.sh", "check_package.py"):
        (tmp_path / name).write_text((recipe_dir / name).read_text())
    meta = tmp_path / "meta.yaml"
    meta.write_text(meta.read_text().replace("pin_compatible('pytorch', exact=True)", "pin_compatible('pytorch')"))
    (variant, v1), *_ = _render_v1(tmp_path)
    drifted = _render_meta(tmp_path, {k: str(v) for k, v in variant.items()})
    assert [_v1_pin(d) for d in v1["requirements"]["run"]] != drifted["requirements"]["run"]
