"""GPU tests: flash-attn and the demo extension, run with an installed prefix's python.

`scripts/gpu-e2e` runs these on the GPU node with the python of the prefix it installed from
our channel, so they test the built packages, not a development checkout. Elsewhere they skip:
every test that asks for the `device` fixture skips when torch is missing or sees no CUDA device,
and the flash-attn/transformers modules skip at import when those packages are missing
(gpu_env.py: with EXTFORGE_GPU_REQUIRED=1 each of these fails instead). Tests that need no GPU
(the benchmark's pure logic) run everywhere.

Inputs are random and fresh on every run; the seed is printed in every failure message.
Reproduce a failure with EXTFORGE_GPU_SEED=<seed>.

The prefix has no extforge, so keep pytest away from tests/conftest.py (which imports it):

    EXTFORGE_GPU_REQUIRED=1 <prefix>/bin/python -m pytest --confcutdir=tests/gpu tests/gpu
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_env import draw_seed, import_or_skip, unavailable


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def device():
    """The CUDA device the tests run on; skips the test where there is none."""
    torch = import_or_skip("torch")
    if not torch.cuda.is_available():
        unavailable(f"torch {torch.__version__} sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def seed(device) -> int:
    """A fresh seed per test (or EXTFORGE_GPU_SEED), already applied to torch's generators."""
    return draw_seed()
