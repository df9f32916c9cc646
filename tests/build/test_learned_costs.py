"""`extforge build` learns a recipe's costs: a real rattler-build build whose script runs ninja
(as torch's BuildExtension does) leaves its ninja log to the cost store, and the next build of
the recipe is planned from it."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from extforge.building.build import build_environment, build_recipe
from extforge.building.build_options import BuildOptions
from extforge.planning import cost_store

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


# Three real compiles through the compile launcher extforge build passes (EXTFORGE_COMPILER_LAUNCHER,
# ccache), each a translation unit of ~2 s (std::regex); `token` makes them new to a shared cache.
CACHED_RECIPE = """\
schema_version: 1
context:
  name: cache-demo
  version: "0.1.0"
package:
  name: ${{{{ name }}}}
  version: ${{{{ version }}}}
build:
  noarch: generic
  number: 0
  script:
    env:
      MAX_JOBS: ${{{{ env.get("MAX_JOBS", default="1") }}}}
      EXTFORGE_COMPILER_LAUNCHER: ${{{{ env.get("EXTFORGE_COMPILER_LAUNCHER", default="") }}}}
      CCACHE_DIR: ${{{{ env.get("CCACHE_DIR", default="") }}}}
      CCACHE_BASEDIR: ${{{{ env.get("CCACHE_BASEDIR", default="") }}}}
      CCACHE_NOHASHDIR: ${{{{ env.get("CCACHE_NOHASHDIR", default="") }}}}
      CCACHE_COMPILERCHECK: ${{{{ env.get("CCACHE_COMPILERCHECK", default="") }}}}
      CCACHE_STATSLOG: ${{{{ env.get("CCACHE_STATSLOG", default="") }}}}
    content: |
      for u in a_one b_two c_three; do
        extra=""; [ "$u" = c_three ] && extra="{changed}"
        printf '#include <regex>\\n#include <string>\\nbool %s(const std::string& s) {{ return std::regex_match(s, std::regex("[a-z]+{token}%s")); }}\\n' "$u" "$extra" > "$u.cpp"
      done
      printf 'launcher = %s\\n' "$EXTFORGE_COMPILER_LAUNCHER" > build.ninja
      cat >> build.ninja <<'EOF'
      rule cc
        command = $launcher g++ -O1 -c $in -o $out
      build a_one.o: cc a_one.cpp
      build b_two.o: cc b_two.cpp
      build c_three.o: cc c_three.cpp
      EOF
      ninja -j "$MAX_JOBS"
      mkdir -p "$PREFIX/share/cache-demo" && touch "$PREFIX/share/cache-demo/built"
"""


@pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("g++") is None, reason="ninja or g++ is not installed")
def test_compile_cache_hits_are_neither_learned_nor_a_node_speed(tmp_path: Path, own_cost_store: Path, ccache: str) -> None:
    """A rebuild from the compile cache keeps the stored seconds of the units ccache served (its
    per-call verdicts, CCACHE_STATSLOG) and advises no node speed; a unit compiled again is
    learned. The old code learned the hits' copies as units and advised --node-speed 0.0x from them."""
    token = uuid.uuid4().hex[:12]

    def build(n: int, changed: str = "") -> list:
        recipe = tmp_path / f"cache-demo-{n}"
        recipe.mkdir()
        (recipe / "recipe.yaml").write_text(CACHED_RECIPE.format(token=token, changed=changed))
        channel = tmp_path / "empty-channel"
        (channel / "noarch").mkdir(parents=True, exist_ok=True)
        return build_recipe(BuildOptions.make(recipe, [str(channel)], tmp_path / f"out{n}", test=False, audit=False,
                                              profile="cache-demo"))

    build(1)
    first = cost_store.load("cache-demo", "0.1.0")
    assert first is not None and set(first.units) == {"a_one", "b_two", "c_three"} and min(first.units.values()) > 0.3

    (second,) = build(2)
    assert cost_store.load("cache-demo", "0.1.0") == first  # every unit a hit: nothing learned
    assert second.node_speed is None

    build(3, changed="x")
    third = cost_store.load("cache-demo", "0.1.0")
    assert third is not None and third.measured_at > first.measured_at
    assert {u: third.units[u] for u in ("a_one", "b_two")} == {u: first.units[u] for u in ("a_one", "b_two")}
    assert third.units["c_three"] > 0.3
