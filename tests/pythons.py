"""CPythons of other minors for the tests: the one running them where it is that minor, else pyenv's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def find_python(short: str) -> str | None:
    """A CPython of that minor, or None."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == short:
        return sys.executable
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    found = sorted(Path(root, "versions").glob(f"{short}.*/bin/python{short}"))
    return str(found[-1]) if found else None


def python_or_skip(short: str) -> str:
    """A CPython of that minor, or skip the test saying which one is missing and how to add it."""
    found = find_python(short)
    if found is None:
        pytest.skip(f"no CPython {short} here (pyenv install {short})")
    return found
