"""Every variable extforge.compile_cache.env() sets reaches the build script of every recipe.

rattler-build runs build scripts in a strictly isolated environment: a variable that the recipe
does not list under build.script.env silently disappears and the cache stays cold. flash-attn and
FA3 listed the dozen one by one; every recipe is on the build layer now, whose activation reads
them from the settings file `extforge build` writes beside the work folders.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from extforge import compile_cache
from extforge.errors import ExtforgeError
from extforge.recipes import build_layer


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


@pytest.mark.parametrize("tool", compile_cache.TOOLS)
def test_every_cache_variable_reaches_every_recipe_through_the_layer(recipe_dir: Path, tools_on_path: Path,
                                                                     tmp_path: Path, tool: str) -> None:
    env = compile_cache.env(tool, cache_dir=tmp_path / "cache")
    assert env["EXTFORGE_COMPILER_LAUNCHER"].endswith("/compile-launcher.sh " + str(tools_on_path / tool))
    assert compile_cache.cache_tool(env["EXTFORGE_COMPILER_LAUNCHER"]) == str(tools_on_path / tool)
    assert (tmp_path / "cache").is_dir()
    settings = build_layer.write_settings(tmp_path / "out", env)
    shown = subprocess.run(["/bin/bash", "-c", f"source {settings}; env -0"], capture_output=True, check=True,
                           env={"PATH": "/usr/bin:/bin"}).stdout.decode()
    seen = dict(line.split("=", 1) for line in shown.split("\0") if "=" in line)
    assert {k: seen.get(k) for k in env} == env
    for recipe in sorted(recipe_dir.parent.glob("*/recipe.yaml")):
        text = recipe.read_text() + "".join(f.read_text() for f in recipe.parent.glob("meta.yaml"))
        assert build_layer.uses_layer(text) and "EXTFORGE_LAYER" not in text, recipe
        assert not [k for k in env if k in text], recipe  # the layer's, never a recipe's to pass on


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
