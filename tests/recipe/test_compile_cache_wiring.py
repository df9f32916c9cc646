"""Every variable extforge.compile_cache.env() sets reaches the build scripts of flash-attn and FA3.

rattler-build runs build scripts in a strictly isolated environment: a variable that the
recipe does not list under build.script.env silently disappears and the cache stays cold.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

from extforge import compile_cache
from extforge.errors import ExtforgeError


@pytest.fixture()
def tools_on_path(tmp_path: Path, monkeypatch) -> Path:
    # Only their presence on PATH matters to env(); they are never run here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in compile_cache.TOOLS:
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


@pytest.mark.parametrize("recipe", ["flash-attn", "flash-attn-3"])
@pytest.mark.parametrize("tool", compile_cache.TOOLS)
def test_recipe_passes_every_cache_variable(recipe_dir: Path, tools_on_path: Path, tmp_path: Path,
                                            monkeypatch, tool: str, recipe: str) -> None:
    recipe_dir = recipe_dir.parent / recipe
    env = compile_cache.env(tool, cache_dir=tmp_path / "cache")
    assert env["EXTFORGE_COMPILER_LAUNCHER"].endswith("/compile-launcher.sh " + str(tools_on_path / tool))
    assert compile_cache.cache_tool(env["EXTFORGE_COMPILER_LAUNCHER"]) == str(tools_on_path / tool)
    assert (tmp_path / "cache").is_dir()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    recipe = Stage0Recipe.from_file(recipe_dir / "recipe.yaml")
    (variant, *_) = recipe.render(
        VariantConfig.from_file(recipe_dir / "variants-offline.yaml"),
        RenderConfig(platform=PlatformConfig(target_platform="linux-64")),
    )
    script_env = variant.recipe.to_dict()["build"]["script"]["env"]
    assert {k: script_env.get(k) for k in env} == env
    meta = (recipe_dir / "meta.yaml").read_text()
    for key in env:
        assert f"- {key}={{{{ environ.get('{key}'" in meta, key


def test_ccache_ignores_work_dir_paths(tools_on_path: Path, tmp_path: Path) -> None:
    env = compile_cache.env("ccache", cache_dir=tmp_path / "c")
    assert env["CCACHE_BASEDIR"] == "/" and env["CCACHE_NOHASHDIR"] == "1"
    assert env["CCACHE_COMPILERCHECK"] == "content"


def test_default_cache_dir_is_under_cache_root(tools_on_path: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "shared"))
    env = compile_cache.env("sccache")
    place = compile_cache.placement("sccache")
    assert place.configured == tmp_path / "shared" / "compile" / "sccache"
    assert Path(env["SCCACHE_DIR"]).samefile(place.path)
    # Its server listens in that folder, never on the machine's port (another user's server may be there).
    assert Path(env["SCCACHE_SERVER_UDS"]).parent == Path(env["SCCACHE_DIR"])


def test_missing_tool_is_an_actionable_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ExtforgeError) as exc:
        compile_cache.env()
    assert "apt-get install ccache" in exc.value.fix


def test_a_tool_whose_path_holds_a_space_goes_alone(tmp_path: Path) -> None:
    # Recipes split the launcher on spaces: the tool alone still caches, within one path length.
    spaced = tmp_path / "my tools" / "ccache"
    assert compile_cache.launcher_command(spaced) == str(spaced)
    assert compile_cache.cache_tool(str(spaced)) == str(spaced)
