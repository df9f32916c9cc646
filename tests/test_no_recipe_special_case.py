"""The product knows no recipe by name: what it knows of one package (its pip and conda names, its
compiled module, the oldest nvcc its build takes, how to rebuild it) is data, in
src/extforge/data/ or in the recipe's folder. Prose may name a recipe as an example; code may not
branch on one. The old code probed for flash-attn by its names in doctor/ (`flash_attn_facts`,
`FlashAttnFacts`, `"flash_attn_2_cuda"`, `FLASH_ATTN_MIN_NVCC`), which this test names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "extforge"
RECIPES = [p.name for p in (SRC.parents[1] / "recipe").iterdir() if p.is_dir() and p.name != "demo-ext"]
# A recipe's package name, its import name, or a module named after it, as a whole string.
NAME = re.compile("|".join(rf"{re.escape(r)}|{re.escape(r.replace('-', '_'))}(_\w+)?" for r in RECIPES), re.I)


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, nodes) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def special_cases(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if NAME.fullmatch(node.value):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: the string {node.value!r}")
            continue
        found += [f"{path.relative_to(SRC)}:{node.lineno}: the name {n}" for n in names
                  if any(r.replace("-", "") in n.lower().replace("_", "") for r in RECIPES)]
    return found


def test_no_module_of_the_product_names_a_recipe_in_its_code() -> None:
    assert "flash-attn" in RECIPES
    found = [hit for p in sorted(SRC.rglob("*.py")) if "data" not in p.relative_to(SRC).parts for hit in special_cases(p)]
    assert found == [], "move what the code knows of this recipe into data: " + "; ".join(found)
