"""`extforge build` builds a copy of the recipe folder taken as it is checked (recipes.trust): what
that copy cannot hold faithfully (a link out of the folder, a `path:` source outside it) is
refused, and what it can (a relative link inside, a `path:` source inside) builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RECIPE = ('schema_version: 1\npackage: {name: copy-demo, version: "1.0"}\nsource: {path: %s}\n'
          "build: {noarch: generic}\n")
BUILD_SH = 'mkdir -p "$PREFIX/share/copy-demo" && cp data.txt "$PREFIX/share/copy-demo/"\n'


def _recipe(tmp_path: Path, source: str) -> Path:
    recipe = tmp_path / "copy-demo"
    (recipe / "src").mkdir(parents=True)
    (recipe / "src" / "data.txt").write_text("ours\n")
    (recipe / "recipe.yaml").write_text(RECIPE % source)
    (recipe / "build.sh").write_text(BUILD_SH)
    (tmp_path / "channel" / "noarch").mkdir(parents=True)
    return recipe


def _build(tmp_path: Path, recipe: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "extforge", "build", str(recipe), "--channel", str(tmp_path / "channel"),
                           "--output-dir", str(tmp_path / "out"), "--no-test", "--no-audit"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300",
                                                       "EXTFORGE_CACHE": str(tmp_path / "cache")})


def test_a_link_out_of_the_recipe_folder_is_refused_and_one_inside_builds(tmp_path: Path) -> None:
    """main built a recipe whose build.sh was a link to a file elsewhere, reading whatever it led
    to when the script ran (nothing checked who may write it). Now a link leading out of the
    folder is refused naming it (exit 2); a relative link inside it is copied as a link and builds."""
    recipe = _recipe(tmp_path, "src")
    (recipe / "build.sh").rename(tmp_path / "elsewhere.sh")
    (recipe / "build.sh").symlink_to(tmp_path / "elsewhere.sh")
    res = _build(tmp_path, recipe)
    assert res.returncode == 2, res.stderr
    assert f"refusing to run the recipe {recipe}: {recipe / 'build.sh'}: it is a link to " in res.stderr

    (recipe / "build.sh").unlink()
    (recipe / "scripts").mkdir()
    (tmp_path / "elsewhere.sh").rename(recipe / "scripts" / "build.sh")
    (recipe / "build.sh").symlink_to("scripts/build.sh")
    res = _build(tmp_path, recipe)
    assert res.returncode == 0, res.stderr
    assert list((tmp_path / "out" / "noarch").glob("copy-demo-1.0-*.conda"))


def test_a_path_source_out_of_the_recipe_folder_is_refused(tmp_path: Path) -> None:
    """main built `source: {path: ../src}` from a folder nobody checked. Now refused naming the
    recipe (not its copy) and the source, before anything is solved or run (exit 2)."""
    recipe = _recipe(tmp_path, "../src")
    (recipe / "src").rename(tmp_path / "src")
    res = _build(tmp_path, recipe)
    assert res.returncode == 2, res.stderr
    assert f"{recipe / 'recipe.yaml'}: its source `path: ../src` is out of the recipe folder" in res.stderr
    assert not (tmp_path / "out" / "noarch").exists()
