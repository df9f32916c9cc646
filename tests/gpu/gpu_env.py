"""Whether the GPU tests can run here: skip where they cannot, or fail where they must run.

On a development machine a missing GPU or package is a reason to skip. On the GPU node
`scripts/gpu-e2e` sets EXTFORGE_GPU_REQUIRED=1, so that a package our channel failed to
install, or a GPU torch cannot see, fails the run instead of shrinking it to a row of skips.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest

REQUIRED_ENV = "EXTFORGE_GPU_REQUIRED"
SEED_ENV = "EXTFORGE_GPU_SEED"


def unavailable(reason: str) -> None:
    """Skip the current test or module, or fail it when the GPU tests are required to run."""
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{reason} (and {REQUIRED_ENV}=1)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_skip(name: str) -> ModuleType:
    """Import a top-level package; skip only when it is absent, never when it is broken.

    pytest.importorskip would also skip a package whose compiled part fails to load with a
    ModuleNotFoundError, which is exactly the packaging defect these tests exist to catch.
    """
    if importlib.util.find_spec(name) is None:
        unavailable(f"{name} is not installed")
    return importlib.import_module(name)


def draw_seed() -> int:
    """A fresh seed (or EXTFORGE_GPU_SEED to reproduce a failure), applied to torch's generators."""
    import torch

    value = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(value)  # seeds the CUDA generators too
    return value
