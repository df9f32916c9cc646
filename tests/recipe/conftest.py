import shutil
from pathlib import Path

import pytest

from extforge.locking import exclusive
from extforge.planning import cost_store
from extforge.recipes import sources
from fixture_keys import build_key

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn"
CAUSAL_CONV1D = RECIPE_DIR.parent / "causal-conv1d"


@pytest.fixture(scope="session")
def recipe_dir() -> Path:
    return RECIPE_DIR


@pytest.fixture(scope="session")
def causal_conv1d_build(mirror_channel: Path, fixtures_dir: Path) -> Path:
    """A folder holding `channel/`, the output of recipe/causal-conv1d built against `mirror_channel`
    (~7 min on 2 cores), and `cost-store/`, the store that build started empty (the recipe's
    build-costs.json planned it) and taught: built once per recipe, channel and build code, then
    reused by the tests of its package and of its wheel."""
    from extforge.building.build import build_recipe
    from extforge.building.build_options import BuildOptions

    out = fixtures_dir / "causal-conv1d" / build_key(CAUSAL_CONV1D, mirror_channel)
    with exclusive(fixtures_dir / "causal-conv1d.lock"):
        if not (out / ".complete").exists():
            shutil.rmtree(out.parent, ignore_errors=True)  # older keys' builds: a package is ~50 MB
            stored, _ = sources.fetch(sources.read_spec(CAUSAL_CONV1D))  # PyPI once, then the source cache; sha256 checked
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("EXTFORGE_SOURCES", str(stored.parents[2]))
                mp.setenv(cost_store.STORE_ENV, str(out / "cost-store"))
                build_recipe(BuildOptions.make(CAUSAL_CONV1D, [mirror_channel], out / "channel"))
            (out / ".complete").touch()
    return out
