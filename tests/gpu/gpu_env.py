"""Whether the GPU tests can run here: skip where they cannot, or fail where they must run.

On a development machine a missing GPU or package is a reason to skip. On the GPU node
`scripts/gpu-e2e` sets EXTFORGE_GPU_REQUIRED=1, so that a package our channel failed to
install, or a GPU torch cannot see, fails the run instead of shrinking it to a row of skips.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
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


BENCH = Path(__file__).resolve().parents[2] / "bench" / "attention_bench.py"


def load_bench() -> ModuleType:
    """bench/attention_bench.py as a module (its cases, arithmetic and the build's head dims)."""
    if "attention_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("attention_bench", BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules["attention_bench"]


def built_head_dims() -> tuple[int, ...] | None:
    """Head dims of the installed flash-attn build (None: every head dim)."""
    return load_bench().built_head_dims()


def require_head_dim(headdim: int) -> None:
    """Skip a test of a head dim whose kernels this flash-attn build does not have."""
    built = built_head_dims()
    if built is not None and not any(lo < headdim <= hi for lo, hi in _buckets() if hi in built):
        pytest.skip(f"head dim {headdim} is not in this build (head dims {';'.join(map(str, built))})")


def _buckets() -> list[tuple[int, int]]:
    """flash-attn rounds a head dim up to the next kernel: (lower, upper] per kernel."""
    dims = (32, 64, 96, 128, 192, 256)
    return list(zip((0,) + dims[:-1], dims))
