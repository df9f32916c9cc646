"""Doctor's parsers against real output formats."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from extforge.doctor.compiler import parse_abi_macros
from extforge.doctor.driver import parse_gpu_query, parse_proc_version, parse_smi_banner
from extforge.doctor.nvcc import parse_nvcc_version

from .fakes import NVCC_BANNERS, SMI_H100_BANNER, SMI_H100_QUERY

# Excerpt of an R610 banner (github.com/sgl-project/sglang/issues/27487): the labels changed.
SMI_R610_BANNER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |
+-----------------------------------------+------------------------+----------------------+
"""


@pytest.mark.parametrize(
    ("version", "full"), [("11.5", "V11.5.119"), ("12.8", "V12.8.93"), ("13.0", "V13.0.88")]
)
def test_nvcc_banner(version: str, full: str) -> None:
    assert parse_nvcc_version(NVCC_BANNERS[version]) == (version, full)


def test_nvcc_banner_of_something_else() -> None:
    assert parse_nvcc_version("nvc++-Error-Unknown switch: --version") is None


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc on this machine")
def test_nvcc_banner_of_the_installed_nvcc() -> None:
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    parsed = parse_nvcc_version(out)
    assert parsed is not None and parsed[1].startswith("V" + parsed[0])


def test_smi_banner_h100_580() -> None:
    assert parse_smi_banner(SMI_H100_BANNER) == ("580.65.06", "13.0")


def test_smi_banner_r610_labels() -> None:
    assert parse_smi_banner(SMI_R610_BANNER) == ("610.43.02", "13.3")


def test_smi_banner_failure_text() -> None:
    text = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert parse_smi_banner(text) == (None, None)


def test_gpu_query_csv() -> None:
    gpus = parse_gpu_query(SMI_H100_QUERY + "NVIDIA A100-SXM4-80GB, 8.0, 580.65.06\n")
    assert [(g.name, g.sm, g.driver_version) for g in gpus] == [
        ("NVIDIA H100 80GB HBM3", "sm_90", "580.65.06"),
        ("NVIDIA A100-SXM4-80GB", "sm_80", "580.65.06"),
    ]


def test_gpu_query_old_smi_without_compute_cap() -> None:
    # nvidia-smi before compute_cap existed answers with an error line, not csv rows.
    assert parse_gpu_query('Field "compute_cap" is not a valid field to query.\n') == []


def test_proc_driver_version() -> None:
    text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
        "(dvs-builder@U22-I3-AF03-09-1)  Sun Jul 27 06:54:38 UTC 2025\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
    )
    assert parse_proc_version(text) == "580.65.06"


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["-D_GLIBCXX_USE_CXX11_ABI=0"], False)])
def test_abi_macro_from_the_real_compiler(flag: list[str], expected: bool) -> None:
    gxx = shutil.which("g++")
    if not gxx:
        pytest.skip("no g++")
    out = subprocess.run(
        [gxx, *flag, "-x", "c++", "-dM", "-E", "-"], input="#include <string>\n", capture_output=True, text=True, check=True
    ).stdout
    assert parse_abi_macros(out) is expected


def test_abi_macro_absent() -> None:
    assert parse_abi_macros("#define __clang__ 1\n") is None
