"""Probes on fake machines (scripts printing real nvcc/nvidia-smi output), then the findings."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from extforge.doctor.checks import diagnose
from extforge.doctor.compiler import probe_compiler
from extforge.doctor.driver import probe_driver
from extforge.doctor.model import Facts, Gpu, TorchFacts
from extforge.doctor.nvcc import find_nvccs, torch_cuda_home

from .conftest import FakeMachine
from .fakes import SMI_H100_BANNER, fake_nvidia_smi, fake_toolkit, write_script

TORCH_CU128 = TorchFacts("2.7.1+cu128", "12.8", True, "/env/lib/torch/lib", ("sm_80", "sm_90"))
TORCH_CU130 = TorchFacts("2.14.1+cu130", "13.0", True, "/env/lib/torch/lib", ("sm_80", "sm_90", "sm_100"))
NO_PROC = Path("/nonexistent/proc/driver/nvidia/version")


def facts_for(m: FakeMachine, torch: TorchFacts | None) -> Facts:
    return Facts(
        torch=torch,
        nvccs=find_nvccs(m.env, m.globs),
        cuda_home=torch_cuda_home(m.env),
        driver=probe_driver(m.env, NO_PROC),
    )


def titles(facts: Facts) -> list[str]:
    return [f"{f.severity}: {f.title}" for f in diagnose(facts)]


def test_every_nvcc_is_found_in_path_order_with_its_version(shadowed_machine: FakeMachine) -> None:
    nvccs = find_nvccs(shadowed_machine.env, shadowed_machine.globs)
    assert [(n.version, n.found_via) for n in nvccs] == [("11.5", ("PATH[0]",)), ("12.8", (shadowed_machine.globs[0],))]
    assert nvccs[1].toolkit_root == str(shadowed_machine.root / "usr/local/cuda-12.8")


def test_torch_would_take_cuda_home_from_the_first_nvcc_on_path(shadowed_machine: FakeMachine) -> None:
    home = torch_cuda_home(shadowed_machine.env)
    assert home.path == str(shadowed_machine.root / "usr")
    assert home.reason.startswith("nvcc on PATH")


def test_shadowing_nvcc_11_5_is_an_error_whose_fix_names_the_right_toolkit(shadowed_machine: FakeMachine) -> None:
    facts = facts_for(shadowed_machine, TORCH_CU128)
    errors = [f for f in diagnose(facts) if f.severity == "error"]
    assert len(errors) == 1
    assert "older than 11.7" in errors[0].title and "FlashAttention is only supported" in errors[0].cause
    toolkit = shadowed_machine.root / "usr/local/cuda-12.8"
    assert errors[0].fix == f"export CUDA_HOME={toolkit} PATH={toolkit}/bin:$PATH"


def test_applying_the_fix_clears_the_nvcc_findings(shadowed_machine: FakeMachine) -> None:
    toolkit = shadowed_machine.root / "usr/local/cuda-12.8"
    env = dict(shadowed_machine.env, CUDA_HOME=str(toolkit), PATH=f"{toolkit}/bin{os.pathsep}{shadowed_machine.env['PATH']}")
    facts = facts_for(FakeMachine(shadowed_machine.root, env, shadowed_machine.globs), TORCH_CU128)
    assert titles(facts) == []


def test_cuda_home_set_but_path_still_shadowed_is_a_warning(shadowed_machine: FakeMachine) -> None:
    toolkit = shadowed_machine.root / "usr/local/cuda-12.8"
    env = dict(shadowed_machine.env, CUDA_HOME=str(toolkit))
    facts = facts_for(FakeMachine(shadowed_machine.root, env, shadowed_machine.globs), TORCH_CU128)
    assert titles(facts) == ["warning: the nvcc on PATH (11.5) is not the one builds use (12.8)"]


def test_major_mismatch_with_torch_is_an_error(shadowed_machine: FakeMachine) -> None:
    toolkit = shadowed_machine.root / "usr/local/cuda-12.8"
    env = dict(shadowed_machine.env, CUDA_HOME=str(toolkit), PATH=f"{toolkit}/bin:{shadowed_machine.root}/usr/bin")
    found = titles(facts_for(FakeMachine(shadowed_machine.root, env, shadowed_machine.globs), TORCH_CU130))
    assert found == ["error: nvcc 12.8 does not match torch's CUDA 13.0"]


def test_h100_with_driver_580_is_read_from_nvidia_smi(shadowed_machine: FakeMachine) -> None:
    d = probe_driver(shadowed_machine.env, NO_PROC)
    assert (d.driver_version, d.max_cuda) == ("580.65.06", "13.0")
    assert d.gpus == (Gpu("NVIDIA H100 80GB HBM3", "9.0", "580.65.06"),)
    assert d.gpus[0].sm == "sm_90"


def test_driver_older_than_torchs_cuda(tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin" / "nvidia-smi", banner=SMI_H100_BANNER.replace(
        "Driver Version: 580.65.06      CUDA Version: 13.0", "Driver Version: 535.183.06     CUDA Version: 12.2"))
    facts = Facts(torch=TORCH_CU130, driver=probe_driver({"PATH": str(tmp_path / "bin")}, NO_PROC))
    assert titles(facts) == ["error: driver 535.183.06 supports CUDA up to 12.2; torch needs 13.0"]


def test_gpu_arch_missing_from_torch() -> None:
    from extforge.doctor.model import DriverFacts

    torch = TorchFacts("2.14.1+cu130", "13.0", True, "/x", ("sm_80",))
    facts = Facts(torch=torch, driver=DriverFacts("580.65.06", "13.0", (Gpu("NVIDIA H100 80GB HBM3", "9.0"),)))
    assert titles(facts) == ["error: torch 2.14.1+cu130 has no kernels for NVIDIA H100 80GB HBM3 (sm_90)"]


def test_no_driver_is_said_plainly(tmp_path: Path) -> None:
    d = probe_driver({"PATH": str(tmp_path)}, NO_PROC)
    assert d.driver_version is None and d.source.startswith("no driver")
    assert titles(Facts(driver=d)) == ["info: no NVIDIA driver on this machine"]


def test_driver_version_from_proc_when_nvidia_smi_is_missing(tmp_path: Path) -> None:
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\n")
    d = probe_driver({"PATH": str(tmp_path)}, proc)
    assert d.driver_version == "580.65.06" and d.max_cuda is None


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++")
def test_compiler_defaulting_to_the_old_abi_is_a_warning(tmp_path: Path) -> None:
    # What a devtoolset-style compiler looks like: a real g++ whose default ABI is 0.
    write_script(tmp_path / "c++", f'exec {shutil.which("g++")} -D_GLIBCXX_USE_CXX11_ABI=0 "$@"\n')
    compiler = probe_compiler({"PATH": str(tmp_path)})
    assert compiler.default_cxx11_abi is False and compiler.version_line
    found = diagnose(Facts(torch=TORCH_CU130, compiler=compiler))
    assert [f.title for f in found] == ["c++ defaults to _GLIBCXX_USE_CXX11_ABI=0, torch uses 1"]
    assert found[0].fix == 'export CXXFLAGS="-D_GLIBCXX_USE_CXX11_ABI=1 $CXXFLAGS"'


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++")
def test_compiler_without_a_shared_libstdcxx_is_a_warning(tmp_path: Path) -> None:
    # A relocated gcc with only libstdc++.a beside it answers -print-file-name with the bare name.
    write_script(tmp_path / "c++", 'case "$1" in -print-file-name=*) echo "${1#-print-file-name=}"; exit 0;; esac\n'
                                   f'exec {shutil.which("g++")} "$@"\n')
    compiler = probe_compiler({"PATH": str(tmp_path)})
    assert compiler.shared_libstdcxx is None and compiler.default_cxx11_abi is True
    (found,) = diagnose(Facts(torch=TORCH_CU130, compiler=compiler))
    assert found.title == "c++ links libstdc++ statically: it finds no libstdc++.so"
    assert found.fix.startswith("export CXX=/usr/bin/g++")


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++")
def test_compiler_matching_torch_is_quiet() -> None:
    compiler = probe_compiler({"PATH": os.environ["PATH"], "CXX": "g++"})
    assert compiler.default_cxx11_abi is True
    assert diagnose(Facts(torch=TORCH_CU130, compiler=compiler)) == []


def test_no_compiler(tmp_path: Path) -> None:
    compiler = probe_compiler({"PATH": str(tmp_path)})
    assert titles(Facts(torch=TORCH_CU130, compiler=compiler)) == ["error: no C++ compiler: c++ is not on PATH"]


def test_cuda_home_without_headers(tmp_path: Path) -> None:
    # This development machine's layout: a /usr/local/bin/nvcc wrapper makes torch pick CUDA_HOME=/usr/local.
    toolkit = fake_toolkit(tmp_path / "local" / "cuda-13.0", "13.0")
    write_script(tmp_path / "local" / "bin" / "nvcc", f'exec {toolkit}/bin/nvcc "$@"\n')
    env = {"PATH": str(tmp_path / "local" / "bin")}
    facts = Facts(torch=TORCH_CU130, nvccs=find_nvccs(env, (str(tmp_path / "local" / "cuda*"),)), cuda_home=torch_cuda_home(env))
    found = diagnose(facts)
    assert [f.title for f in found] == [f"CUDA_HOME resolves to {tmp_path / 'local'}, which has no include/cuda_runtime.h"]
    assert found[0].fix == f"export CUDA_HOME={toolkit} PATH={toolkit}/bin:$PATH"
