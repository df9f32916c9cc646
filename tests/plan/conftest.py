from collections.abc import Iterator

import pytest

from recipe_costs import shipped


@pytest.fixture(autouse=True)
def _shipped() -> Iterator[None]:
    """The planner's tests plan flash-attn and FA3 from the costs their recipe folders ship."""
    with shipped("flash-attn", "flash-attn-3"):
        yield
