"""torch_cxx_std.py of the build layer (extforge-torch-build): the C++ standard a torch's headers
require, read from their `__cplusplus` guard, else probed with a real g++."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_select_sources import torch_headers

SCRIPT = Path(__file__).resolve().parents[2] / "src" / "extforge" / "data" / "torch-build" / "torch_cxx_std.py"
# The head of torch 2.14.1's ATen/ATen.h, verbatim.
ATEN_2_14 = """#pragma once

#if !defined(_MSC_VER) && __cplusplus < 202002L
#error C++20 or later compatible compiler is required to use ATen.
#endif
"""


def run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)})


def fake_torch(tmp_path: Path, aten: str, headers: dict[str, str] | None = None) -> Path:
    """A site folder with a `torch` package holding only headers (the script never imports it)."""
    include = tmp_path / "site" / "torch" / "include"
    (include / "ATen").mkdir(parents=True)
    (include.parent / "__init__.py").write_text("raise ImportError('torch_cxx_std.py must not import torch')\n")
    (include / "ATen" / "ATen.h").write_text(aten)
    for rel, text in (headers or {}).items():
        (include / rel).parent.mkdir(parents=True, exist_ok=True)
        (include / rel).write_text(text)
    return tmp_path / "site"


def test_the_guard_of_torch_2_14_asks_for_cxx20(tmp_path: Path) -> None:
    proc = run(fake_torch(tmp_path, ATEN_2_14))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "c++20"


def test_the_highest_guard_of_the_entry_headers_wins(tmp_path: Path) -> None:
    older = ATEN_2_14.replace("202002L", "201703L").replace("C++20", "C++17")
    site = fake_torch(tmp_path, older, {"c10/macros/Macros.h": "#if __cplusplus < 202302L\n#error needs C++23\n#endif\n"})
    assert run(site).stdout.strip() == "c++23"
    # A comparison that is no guard (ArrayRef.h: `#if __cplusplus >= 202002L`) sets nothing.
    (site / "torch/include/c10/macros/Macros.h").write_text("#if __cplusplus >= 202002L\n#define X 1\n#endif\n")
    assert run(site).stdout.strip() == "c++17"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_headers_without_a_guard_are_probed_with_the_compiler(tmp_path: Path) -> None:
    # Needs C++20 (operator<=>) and says so only by failing to compile under C++17.
    site = fake_torch(tmp_path, "#pragma once\n#include <compare>\ninline auto at_order(int a, int b) { return a <=> b; }\n")
    proc = run(site, "g++")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "c++20"
    (site / "torch/include/ATen/ATen.h").write_text("#pragma once\nint at_broken(;\n")
    proc = run(site, "g++")
    assert proc.returncode != 0 and "compiles torch's ATen/ATen.h with none of c++17, c++20, c++23" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_python_without_torch_is_told_so(tmp_path: Path) -> None:
    proc = run(tmp_path)
    assert proc.returncode != 0 and "has no torch" in proc.stderr and "Traceback" not in proc.stderr


def test_torch_2_14_1s_real_headers_need_cxx20() -> None:
    torch = torch_headers("2.14.1")
    if torch is None:
        pytest.skip("no torch 2.14.1 wheel in the cache (tests/audit installs one)")
    proc = run(torch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "c++20"
