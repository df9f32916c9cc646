"""The seed rows' disk guard reserves what the part still cold will add (measured per part) and
says so when it skips; a warm cache reserves only the scratch space."""

from __future__ import annotations

import json
import os
from pathlib import Path

from extforge.mirror.recipes import code_generation

from .conftest import INSTALL_GIB, MIRROR_GIB, SCRATCH_GIB, _mark_warm_parts_used, disk_need, disk_shortfall

GIB = 2**30
TORCH = "pytorch-2.9.1-cuda128_py312_h0_0"


def _record(tmp_path: Path, files: list[Path], generation: str | None = None) -> Path:
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"packages": [str(f) for f in files], "generation": generation or code_generation()}))
    return record


def _mirrored(tmp_path: Path) -> tuple[Path, Path]:
    pkg = tmp_path / "packages" / f"{TORCH}.conda"
    pkg.parent.mkdir()
    pkg.write_bytes(b"x")
    return pkg, _record(tmp_path, [pkg])


def test_a_cold_cache_reserves_every_part_and_the_skip_names_them(tmp_path: Path):
    need = disk_need(tmp_path / "no-record.json", tmp_path / "pkgs")
    assert need.total == MIRROR_GIB + INSTALL_GIB + SCRATCH_GIB
    reason = disk_shortfall(int((need.total - 1) * GIB), need)
    assert reason is not None
    assert f"~{need.total:.1f} GiB" in reason and f"mirror {MIRROR_GIB:.1f} GiB" in reason
    assert f"scratch {SCRATCH_GIB:.1f} GiB" in reason and "EXTFORGE_CACHE" in reason
    assert disk_shortfall(int(need.total * GIB) + 1, need) is None


def test_mirrored_rows_reserve_the_extraction_until_their_torch_is_extracted(tmp_path: Path):
    _, record = _mirrored(tmp_path)
    need = disk_need(record, tmp_path / "pkgs")
    assert need.parts == {"extracted packages, builds and envs": INSTALL_GIB, "scratch": SCRATCH_GIB}
    (tmp_path / "pkgs" / TORCH).mkdir(parents=True)
    assert disk_need(record, tmp_path / "pkgs").parts == {"scratch": SCRATCH_GIB}


def test_a_package_gone_from_the_cache_makes_the_mirror_cold_again(tmp_path: Path):
    pkg, record = _mirrored(tmp_path)
    (tmp_path / "pkgs" / TORCH).mkdir(parents=True)
    pkg.unlink()
    assert set(disk_need(record, tmp_path / "pkgs").parts) == {"mirror", "extracted packages, builds and envs", "scratch"}


def test_a_channel_the_background_made_is_warm_though_the_cache_lost_a_package(tmp_path: Path):
    # A cold run on a short disk: room-making removed two of row A's mirror packages (still in
    # the seed channel) after the background had made the channel, built and installed
    # every row; the guard then reserved 49.8 GiB for work that was done and skipped the rows.
    pkg, record = _mirrored(tmp_path)
    (tmp_path / "pkgs" / TORCH).mkdir(parents=True)
    pkg.unlink()
    assert disk_need(record, tmp_path / "pkgs", channel_made=True).parts == {"scratch": SCRATCH_GIB}
    (tmp_path / "pkgs" / TORCH).rmdir()
    assert disk_need(record, tmp_path / "pkgs", channel_made=True).parts == {
        "extracted packages, builds and envs": INSTALL_GIB, "scratch": SCRATCH_GIB}


def test_an_unreadable_record_counts_as_cold(tmp_path: Path):
    record = tmp_path / "record.json"
    record.write_text("{not json")
    assert disk_need(record, tmp_path).total == MIRROR_GIB + INSTALL_GIB + SCRATCH_GIB


def test_a_record_of_another_generation_of_the_mirror_is_cold_and_marks_nothing_in_use(tmp_path: Path):
    # The mirror's code changed since the record: its packages are a dead generation, which must
    # stay the first to go when a cold run makes room (a CI run filled its disk when they did not).
    pkg, _ = _mirrored(tmp_path)
    (tmp_path / "pkgs" / TORCH).mkdir(parents=True)
    for part in (pkg.parent, tmp_path / "pkgs" / TORCH):
        os.utime(part, (1, 1))
    record = _record(tmp_path, [pkg], generation="0" * 64)
    assert disk_need(record, tmp_path / "pkgs").total == MIRROR_GIB + INSTALL_GIB + SCRATCH_GIB
    _mark_warm_parts_used(record, tmp_path / "pkgs")
    assert pkg.parent.stat().st_mtime == 1 and (tmp_path / "pkgs" / TORCH).stat().st_mtime == 1
    _mark_warm_parts_used(_record(tmp_path, [pkg]), tmp_path / "pkgs")
    assert pkg.parent.stat().st_mtime > 1 and (tmp_path / "pkgs" / TORCH).stat().st_mtime > 1
