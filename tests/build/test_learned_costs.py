"""`extforge build` learns a recipe's costs: a real rattler-build build whose script runs ninja
(as torch's BuildExtension does) leaves its ninja log to the cost store, and the next build of
the recipe is planned from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from extforge import cost_store
from extforge.build import build_environment, build_recipe
from extforge.build_options import BuildOptions

# Three "compiles" of different lengths, in name order (setuptools' order), on the planner's job slots.
RECIPE = """\
schema_version: 1
context:
  name: ninja-demo
  version: "0.3.0"
package:
  name: ${{ name }}
  version: ${{ version }}
build:
  noarch: generic
  number: 0
  script:
    env:
      MAX_JOBS: ${{ env.get("MAX_JOBS", default="1") }}
    content: |
      cat > build.ninja <<'EOF'
      rule cc
        command = sleep $secs && touch $out
      build a_short.o: cc
        secs = 0.2
      build b_long.o: cc
        secs = 1.2
      build c_mid.o: cc
        secs = 0.6
      EOF
      ninja -j "$MAX_JOBS"
      mkdir -p "$PREFIX/share/ninja-demo" && touch "$PREFIX/share/ninja-demo/built"
"""


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not installed")
def test_a_build_teaches_the_store_and_the_next_plan(tmp_path: Path, own_cost_store: Path) -> None:
    recipe = tmp_path / "ninja-demo"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text(RECIPE)
    channel = tmp_path / "empty-channel"
    (channel / "noarch").mkdir(parents=True)
    first = build_environment(RECIPE, [], {}, "ninja-demo")
    assert "EXTFORGE_UNIT_ORDER" not in first and int(first["MAX_JOBS"]) >= 1

    built = build_recipe(BuildOptions.make(recipe, [str(channel)], tmp_path / "out", test=False, audit=False))
    assert [p.name for p in built] == ["ninja-demo"]

    entry = json.loads((own_cost_store / "ninja-demo" / "0.3.0.json").read_text())
    assert list(entry["units"]) == ["a_short", "b_long", "c_mid"]
    assert entry["units"]["b_long"] > entry["units"]["c_mid"] > entry["units"]["a_short"]
    assert entry["largest_process_bytes"] > 0
    env = build_environment(RECIPE, [], {}, "ninja-demo")
    assert env["EXTFORGE_UNIT_ORDER"] == "b_long;c_mid;a_short"
    learned = cost_store.load("ninja-demo", "0.3.0")
    # The recipe ran ninja with the planner's MAX_JOBS: the log shows that many at once.
    assert learned is not None and learned.jobs == min(int(first["MAX_JOBS"]), 3)
