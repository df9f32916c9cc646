"""The cost data the repository's recipe folders ship (their build-costs.json), as `extforge build
RECIPE` and `extforge plan RECIPE` read it for the recipe they plan."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from extforge.planning import cost_store

RECIPES = Path(__file__).resolve().parent.parent / "recipe"


@contextlib.contextmanager
def shipped(*names: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(cost_store.recipe_costs(RECIPES / name))
        yield
