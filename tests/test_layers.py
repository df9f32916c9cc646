"""Every module of extforge sits in a layer of the import contract (pyproject.toml), so a new
module cannot dodge the one-way import rule by being left out of it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_module_has_a_layer() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    named = {m.strip() for layer in layers for m in re.split(r"[|:]", layer)}
    package = REPO / "src" / "extforge"
    top = {f"extforge.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    top |= {f"extforge.{p.parent.name}" for p in package.glob("*/__init__.py")}
    assert top - named == set(), "add these modules to a layer in [tool.importlinter] of pyproject.toml"
    assert named - top == set(), "these layers name modules that no longer exist"
