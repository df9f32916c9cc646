"""Every test folder is collected: pytest never enters a folder that matches norecursedirs, whose
default holds `build`, and tests/build's 83 tests went unrun for days (tests that cannot fail)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_no_test_folder_matches_norecursedirs(pytestconfig: pytest.Config) -> None:
    patterns = pytestconfig.getini("norecursedirs")
    skipped = sorted(d.relative_to(REPO).as_posix() for d in (REPO / "tests").rglob("*")
                     if d.is_dir() and any(d.rglob("test_*.py")) and any(fnmatch.fnmatch(d.name, p) for p in patterns))
    assert skipped == [], f"pytest does not enter {skipped} (norecursedirs {patterns}): set it in pyproject.toml"
