"""Fixtures: fake machines for doctor's probes (see fakes.py for the output formats)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from .fakes import fake_nvcc, fake_nvidia_smi, fake_toolkit


@dataclass
class FakeMachine:
    root: Path
    env: dict[str, str]
    globs: tuple[str, ...]


@pytest.fixture
def shadowed_machine(tmp_path: Path) -> FakeMachine:
    """The classic: /usr/bin/nvcc 11.5 first on PATH, CUDA 12.8 installed but unused, an H100."""
    usr_bin = tmp_path / "usr" / "bin"
    fake_nvcc(usr_bin / "nvcc", "11.5")
    fake_nvidia_smi(usr_bin / "nvidia-smi")
    fake_toolkit(tmp_path / "usr" / "local" / "cuda-12.8", "12.8")
    (tmp_path / "usr" / "include").mkdir(parents=True)  # /usr/include lacks cuda_runtime.h unless the distro package adds it
    (tmp_path / "usr" / "include" / "cuda_runtime.h").write_text("/* distro 11.5 */\n")
    env = {"PATH": f"{usr_bin}{os.pathsep}/bin", "HOME": str(tmp_path)}
    return FakeMachine(tmp_path, env, (str(tmp_path / "usr" / "local" / "cuda*"),))
