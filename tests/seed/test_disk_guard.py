"""The seed rows' disk guard: a cold cache on a small disk is skipped with the numbers, a warm
cache never is."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import COLD_CACHE_GIB, disk_shortfall

GIB = 2**30


def test_a_cold_cache_on_a_small_disk_says_how_much_is_missing(tmp_path: Path):
    reason = disk_shortfall(5 * GIB, tmp_path / "no-record.json")
    assert reason is not None
    assert f"~{COLD_CACHE_GIB} GiB" in reason and "5.0 GiB is free" in reason and "EXTFORGE_CACHE" in reason


def test_enough_room_runs_cold(tmp_path: Path):
    assert disk_shortfall(COLD_CACHE_GIB * GIB, tmp_path / "no-record.json") is None


def test_a_warm_cache_runs_on_a_small_disk_until_one_of_its_packages_is_gone(tmp_path: Path):
    kept = tmp_path / "pytorch-2.9.1-cuda128_py312_h0_0.conda"
    kept.write_bytes(b"x")
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"packages": [str(kept)]}))
    assert disk_shortfall(1 * GIB, record) is None
    kept.unlink()
    assert disk_shortfall(1 * GIB, record) is not None


def test_an_unreadable_record_counts_as_cold(tmp_path: Path):
    record = tmp_path / "record.json"
    record.write_text("{not json")
    assert disk_shortfall(1 * GIB, record) is not None
