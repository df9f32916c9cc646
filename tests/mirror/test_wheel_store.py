"""The mirror's wheel downloads: one copy per wheel on disk, whatever request fetched it, and a
pip failure that says why (a full disk by name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from extforge.mirror.inputs import pip_failure, share_wheels


def _wheel(folder: Path, name: str, body: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(body)
    return path


def test_requests_sharing_wheels_keep_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    big = os.urandom(1 << 20)
    # torch alone, then torch with extras: the same nvidia wheel downloaded twice.
    first = _wheel(tmp_path / "torch", "nvidia_x-1.0-py3-none-any.whl", big)
    second = _wheel(tmp_path / "torch+extras", "nvidia_x-1.0-py3-none-any.whl", big)
    extra = _wheel(tmp_path / "torch+extras", "einops-0.8-py3-none-any.whl", b"einops")
    assert share_wheels(first.parent, store) == 0
    assert share_wheels(second.parent, store) == len(big)
    assert first.stat().st_ino == second.stat().st_ino and second.read_bytes() == big
    assert extra.stat().st_nlink == 2  # kept in the store for the next request
    # Run again: nothing left to share, nothing hashed again.
    assert share_wheels(second.parent, store) == 0


def test_a_same_named_wheel_with_other_bytes_stays_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    a = _wheel(tmp_path / "a", "pkg-1.0-py3-none-any.whl", b"one build")
    b = _wheel(tmp_path / "b", "pkg-1.0-py3-none-any.whl", b"a rebuilt wheel, same name")
    share_wheels(a.parent, store)
    assert share_wheels(b.parent, store) == 0
    assert a.stat().st_ino != b.stat().st_ino and b.read_bytes() == b"a rebuilt wheel, same name"
    assert len(list(store.iterdir())) == 2


def test_a_full_disk_is_named(tmp_path: Path) -> None:
    stderr = ("ERROR: Exception:\nTraceback (most recent call last):\n  File \"shutil.py\", line 825, in move\n"
              "OSError: [Errno 28] No space left on device: '/tmp/pip-unpack-x/nvidia_cusolver_cu12-11.7.3.90-py3-none-"
              "manylinux_2_27_x86_64.whl' -> '/cache/mirror/wheels/6205/nvidia_cusolver_cu12-11.7.3.90-py3-none-"
              "manylinux_2_27_x86_64.whl'\n")
    err = pip_failure(stderr, tmp_path)
    assert err.what.startswith("the disk is full") and "GiB free" in err.what
    assert "No space left on device" in err.why
    other = pip_failure("ERROR: No matching distribution found for torch==9.9\n", tmp_path)
    assert other.what == "pip could not download the wheels to mirror" and "torch==9.9" in other.why
