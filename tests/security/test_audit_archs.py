"""Arch-specific (`sm_90a`) and family-specific (`sm_100f`) GPU code is recorded as such and
satisfies only the GPUs NVIDIA's rules let it run on; `--archs` and `--glibc` refuse what they
cannot mean. The kernels are compiled by nvcc; every case runs the real `extforge audit`.

What each kind of code serves, by NVIDIA's compatibility rules (CUDA 12.9+):
- sm_100a runs on compute capability 10.0 only: it does not serve `--archs sm_103`;
- sm_100f runs on the members of its family at or above 10.0, i.e. 10.0 and 10.3 (not 11.0,
  not 12.x): it serves `--archs sm_100` and `--archs sm_103`;
- a suffixed promise (`--archs sm_90a`) names the code the build promised: only that SASS serves it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from extforge.fatbin import arch_runs_on

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
KERNEL = r"""
__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
extern "C" void launch_scale(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""
CODES = {"sm_90": "sm_90", "sm_90a": "sm_90a", "sm_100a": "sm_100a", "sm_100f": "sm_100f", "compute_90a": "compute_90a"}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, Path]:
    if not Path(NVCC).exists():
        pytest.skip("nvcc is not installed")
    root = tmp_path_factory.mktemp("archs")
    (root / "k.cu").write_text(KERNEL)
    procs = {}
    for name, code in CODES.items():
        arch = "compute_" + code.split("_", 1)[1]
        procs[name] = subprocess.Popen(
            [NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode", f"arch={arch},code={code}", "-o", f"{name}.so", "k.cu"],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate()
        assert proc.returncode == 0, f"nvcc {name} failed:\n{out}"
    return {name: root / f"{name}.so" for name in CODES}


def _audit(sandbox, so: Path, archs: str, expect: int) -> dict:
    res = sandbox.run("audit", str(so), "--json", "--archs", archs, expect=expect)
    return json.loads(res.stdout)


@pytest.mark.parametrize("name, recorded", [
    ("sm_90", (["sm_90"], [])), ("sm_90a", (["sm_90a"], [])), ("sm_100a", (["sm_100a"], [])),
    ("sm_100f", (["sm_100f"], [])), ("compute_90a", ([], ["compute_90a"])),
])
def test_suffixed_code_is_recorded_as_such(sandbox, kernels, name, recorded):
    report = json.loads(sandbox.run("audit", str(kernels[name]), "--json", expect=0).stdout)
    assert (report["sass_archs"], report["ptx_archs"]) == recorded


COVERAGE = [
    # module, --archs, exit code
    ("sm_100a", "sm_100", 0),
    ("sm_100a", "sm_103", 1),  # the row: arch-specific 10.0 code does not run on 10.3
    ("sm_100a", "sm_100f", 1),
    ("sm_100f", "sm_100", 0),
    ("sm_100f", "sm_103", 0),  # same family, higher minor
    ("sm_100f", "sm_110", 1),
    ("sm_100f", "sm_120", 1),
    ("sm_100f", "sm_100a", 1),
    ("sm_90a", "sm_90", 0),
    ("sm_90a", "sm_90a", 0),
    ("sm_90", "sm_90a", 1),  # generic code lacks the arch-specific instructions promised
    ("sm_90", "sm_100", 1),
    ("compute_90a", "sm_100", 1),  # arch-specific PTX is not JIT-compiled for other GPUs
]


@pytest.mark.parametrize("module, archs, code", COVERAGE)
def test_suffixed_code_serves_only_its_own_gpus(sandbox, kernels, module, archs, code):
    report = _audit(sandbox, kernels[module], archs, code)
    gpu = [f["message"] for f in report["findings"] if f["check"] == "gpu" and f["severity"] == "error"]
    assert bool(gpu) == bool(code), gpu
    if code:
        assert f"promised {archs} but has no SASS or PTX for it" in gpu[0]


@pytest.mark.parametrize("arch, cc, runs", [
    ("sm_100a", "10.0", True), ("sm_100a", "10.3", False), ("sm_100f", "10.3", True), ("sm_100f", "11.0", False),
    ("sm_120f", "12.1", True), ("sm_103f", "10.0", False), ("compute_90a", "10.0", False),
])
def test_node_admission_follows_the_same_rules(arch, cc, runs):
    """`extforge verify` admits a node from the recorded archs with the same rules."""
    assert arch_runs_on(arch, cc, ptx=arch.startswith("compute_")) is runs


BAD_OPTIONS = [
    (["--glibc", "abc"], "not a glibc version: 'abc'"),
    (["--glibc", "2"], "not a glibc version: '2'"),
    (["--glibc", "3.1"], "not a glibc version: '3.1'"),
    (["--archs", "sm_9x"], "not a CUDA arch: 'sm_9x'"),
    (["--archs", "sm_91"], "not a known CUDA arch: 'sm_91' (known: sm_35"),
    (["--archs", "sm_80a"], "arch-specific 'a' code exists from sm_90 on"),
    (["--archs", "sm_90f"], "family-specific 'f' code exists from sm_100 on"),
    (["--archs", ","], "no GPU arch given"),
]


@pytest.mark.parametrize("args, message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_option_values_are_refused_with_a_clear_message(sandbox, args, message):
    so = sandbox.path("in") / "x.so"
    so.write_bytes(b"\x7fELF")
    res = sandbox.run("audit", str(so), *args)
    res.refused(f"argument {args[0]}", message, code=2)
