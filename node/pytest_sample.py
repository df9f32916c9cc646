"""A pytest plugin (`-p pytest_sample`) that keeps every Nth collected test (EXTFORGE_SAMPLE_EVERY,
default 1: all), in collection order: a deterministic sample of an upstream suite too large to
run whole in a node's allocation. The deselected ones are reported as such by pytest."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = int(os.environ.get("EXTFORGE_SAMPLE_EVERY", "1"))
    if every <= 1:
        return
    kept = [item for i, item in enumerate(items) if i % every == 0]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % every])
    items[:] = kept
