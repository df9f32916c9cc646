"""Shared by the bench scripts: flash-attn's sdist unpacked and edited by the recipe's own
select_sources.py, so a bench compiles exactly the sources a recipe build would."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipe" / "flash-attn"


def unpack(sdist: Path, dest: Path, python: str, *, head_dims: str = "", split: str = "") -> Path:
    """The source tree of `sdist` under `dest`: only `head_dims` (empty: every one), the units in
    `split` (';'-separated) split in two, upstream's source order."""
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    src = next(p for p in dest.iterdir() if (p / "setup.py").is_file())
    subprocess.run([python, str(RECIPE / "select_sources.py"), str(src)], check=True, capture_output=True,
                   env={**os.environ, "FLASH_ATTN_HEAD_DIMS": head_dims, "EXTFORGE_UNIT_ORDER": "",
                        "EXTFORGE_SHARD_UNITS": split})
    return src
