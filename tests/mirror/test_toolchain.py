"""Which g++ the mirror's compiler packages point at: never one that links libstdc++ statically."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.mirror import toolchain

# Like a relocated toolchain that ships only libstdc++.a: g++ finds no libstdc++.so, so every
# link takes the archive.
STATIC_ONLY_GXX = """#!/bin/sh
case "$1" in -print-file-name=*) echo "${1#-print-file-name=}"; exit 0;; esac
exec %s -static-libstdc++ "$@"
"""


@pytest.fixture
def static_only_gxx(tmp_path: Path) -> Path:
    real = shutil.which("g++")
    if real is None:
        pytest.skip("no g++")
    gxx = tmp_path / "static-gcc" / "g++"
    gxx.parent.mkdir()
    gxx.write_text(STATIC_ONLY_GXX % real)
    gxx.chmod(0o755)
    return gxx


def test_a_g_plus_plus_without_shared_libstdcxx_is_replaced(static_only_gxx, monkeypatch):
    assert toolchain.shared_libstdcxx(str(static_only_gxx)) is None
    real = shutil.which("g++")
    assert Path(toolchain.shared_libstdcxx(real)).exists()
    monkeypatch.setenv("CXX", str(static_only_gxx))
    assert toolchain.detect().gxx == real


def test_no_usable_g_plus_plus_is_a_clear_error(static_only_gxx, monkeypatch):
    monkeypatch.setenv("CXX", str(static_only_gxx))
    monkeypatch.setenv("PATH", str(static_only_gxx.parent))
    monkeypatch.setattr(toolchain, "DISTRO_GXX", str(static_only_gxx))
    with pytest.raises(ExtforgeError) as err:
        toolchain.detect()
    assert "links libstdc++ statically" in err.value.what and "-print-file-name=libstdc++.so" in err.value.fix
