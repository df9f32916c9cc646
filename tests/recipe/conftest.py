from pathlib import Path

import pytest

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn"


@pytest.fixture(scope="session")
def recipe_dir() -> Path:
    return RECIPE_DIR
