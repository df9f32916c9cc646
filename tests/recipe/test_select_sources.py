"""recipe/flash-attn/select_sources.py on the real flash-attn 2.8.3 sdist: units longest first,
a head-dim subset, and a head-dim dispatch that throws for the head dims it did not build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.machine import GIB, Machine
from extforge.paths import cache_root
from extforge.planning import plan
from extforge.recipes import sources
from recipe_costs import shipped

LAYER = Path(__file__).resolve().parents[2] / "src" / "extforge" / "data" / "torch-build"

SDIST_NAME = "flash_attn-2.8.3"


@pytest.fixture(scope="module")
def sdist(recipe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = sources.read_spec(recipe_dir)
    roots = [Path(os.environ["EXTFORGE_SOURCES"])] if os.environ.get("EXTFORGE_SOURCES") else []
    found = [p for p in (sources.stored_path(spec, r) for r in [*roots, sources.default_root()]) if p.is_file()]
    if not found:
        try:  # a cold cache: the sdist the recipe pins, verified, into the default source cache
            found = [sources.fetch(spec)[0]]
        except ExtforgeError as e:
            pytest.skip(f"the flash-attn sdist is not in the source cache and could not be fetched: {e.what}")
    out = tmp_path_factory.mktemp("sdist")
    with tarfile.open(found[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(
            (f"{SDIST_NAME}/setup.py", f"{SDIST_NAME}/csrc/flash_attn/", f"{SDIST_NAME}/csrc/cutlass/include/"))]
        tar.extractall(out, members=members, filter="data")
    return out / SDIST_NAME


def run_select(recipe_dir: Path, src: Path, tmp_path: Path, **env: str) -> Path:
    work = tmp_path / "src"
    shutil.copytree(src, work)
    subprocess.run([sys.executable, str(recipe_dir / "select_sources.py"), str(work)], check=True,
                   env={**os.environ, "FLASH_ATTN_HEAD_DIMS": "", "EXTFORGE_UNIT_ORDER": ""} | env)
    return work


def listed_units(setup_py: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r'"csrc/flash_attn/(?:src/)?(\w+)\.(?:cu|cpp)"', setup_py.read_text())]


def test_units_start_longest_first(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    node = Machine(cores=16, memory_bytes=128 * GIB, glibc="2.36", cores_source="t", memory_source="t")
    with shipped("flash-attn"):
        order = list(plan.plan_build(node, "flash-attn", ("90",)).unit_order)
    upstream = listed_units(sdist / "setup.py")
    work = run_select(recipe_dir, sdist, tmp_path, EXTFORGE_UNIT_ORDER=";".join(order))
    assert listed_units(work / "setup.py") == order != upstream
    assert sorted(order) == sorted(upstream)  # the cost data names every unit of this sdist
    # Measured on an H100 node: a non-causal split-kv forward unit is the longest.
    assert order[0].startswith("flash_fwd_split_") and "_causal" not in order[0]
    # The sources are ranked, so that setuptools' sort by name keeps this order.
    assert "ext_modules[-1].sources = [_extforge_unit(s, i) for i, s in enumerate(" in (work / "setup.py").read_text()


def test_without_settings_setup_py_is_unchanged(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    work = run_select(recipe_dir, sdist, tmp_path)
    assert (work / "setup.py").read_text() == (sdist / "setup.py").read_text()
    assert (work / "csrc/flash_attn/src/static_switch.h").read_text() == (sdist / "csrc/flash_attn/src/static_switch.h").read_text()


def test_head_dim_subset_keeps_only_its_kernels(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    work = run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="64;128")
    units = listed_units(work / "setup.py")
    assert len(units) == 1 + 2 * 12 and "flash_api" in units
    assert {u.split("_hdim")[1].split("_")[0] for u in units if "_hdim" in u} == {"64", "128"}


def test_unknown_head_dim_is_refused(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError):
        run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="80")


DISPATCH = r"""
#include <cstdio>
#include <stdexcept>
#include "static_switch.h"
int dispatch(int d) { return HEADDIM_SWITCH(d, [&] { return kHeadDim; }); }
int main() {
  for (int d : {32, 64, 80, 100, 128, 160, 256}) {
    try { std::printf("%d->%d\n", d, dispatch(d)); }
    catch (const std::invalid_argument& e) { std::printf("%d->error: %s\n", d, e.what()); }
  }
}
"""


def test_patched_dispatch_throws_for_unbuilt_head_dims(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    work = run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="64;128")
    (tmp_path / "d.cpp").write_text(DISPATCH)
    # FP16_SWITCH etc. name cutlass types only when expanded; HEADDIM_SWITCH needs no cutlass.
    subprocess.run(["g++", "-std=c++17", "-I", str(work / "csrc/flash_attn/src"), "d.cpp", "-o", "d"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "d")], capture_output=True, text=True, check=True).stdout.splitlines()
    # Upstream rounds up to the next kernel: 64 serves 33..64, 128 serves 97..128.
    assert out[1] == "64->64" and out[3] == "100->128" and out[4] == "128->128"
    for line in (out[0], out[2], out[5], out[6]):
        assert "is not built in this package (built head dims: 64, 128;" in line, line


def torch_headers(*versions: str) -> Path | None:
    """The first of `versions` (default: 2.14.1, then 2.11.0) whose torch wheel tests/audit installed."""
    for version in versions or ("2.14.1", "2.11.0"):
        root = cache_root() / "audit-torch" / version
        if (root / "torch" / "include" / "torch" / "extension.h").is_file():
            return root
    return None


def cxx_std(torch: Path) -> str:
    """The standard the build layer's torch_cxx_std.py derives from these headers (its compiler
    wrappers raise upstream's -std=c++17 to it)."""
    return subprocess.run([sys.executable, str(LAYER / "torch_cxx_std.py"), "g++"], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(torch)}).stdout.strip()


@pytest.mark.skipif(shutil.which("g++") is None or not Path("/usr/local/cuda/include/cuda_runtime.h").is_file(),
                    reason="needs g++ and the CUDA toolkit headers")
def test_patched_flash_api_references_only_built_kernels(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    """flash_api.cpp (the only user of HEADDIM_SWITCH) compiled against torch's headers: its
    undefined kernel symbols are exactly those of the kept .cu files, so the link cannot miss one."""
    torch = torch_headers()
    if torch is None:
        pytest.skip("no torch wheel in the cache (tests/audit installs one)")
    work = run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="128")
    include = ["csrc/flash_attn", "csrc/flash_attn/src", "csrc/cutlass/include", f"{torch}/torch/include",
               f"{torch}/torch/include/torch/csrc/api/include", "/usr/local/cuda/include", f"{torch}/nvidia/cu13/include",
               sysconfig.get_paths()["include"]]
    launcher, env = _through_ccache(work)
    subprocess.run([*launcher, "g++", "-c", "-O0", f"-std={cxx_std(torch)}", "-fPIC", "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda",
                    *[f"-I{i}" for i in include], "csrc/flash_attn/flash_api.cpp", "-o", "flash_api.o"],
                   cwd=work, env=env, check=True)
    syms = subprocess.run(["nm", "-uC", "flash_api.o"], cwd=work, capture_output=True, text=True, check=True).stdout
    kernels = {re.sub(r"cutlass::(half_t|bfloat16_t), ", "", m) for m in re.findall(r"run_mha_\w+<[^>]*>", syms)}
    assert kernels == {f"{fn}<128, {c}>" for fn in ("run_mha_fwd_", "run_mha_bwd_", "run_mha_fwd_splitkv_dispatch")
                       for c in ("false", "true")}


SPLIT = ["flash_fwd_hdim128_bf16_sm80", "flash_bwd_hdim128_fp16_causal_sm80", "flash_fwd_split_hdim128_fp16_sm80"]


def test_shard_units_get_a_twin_listed_beside_them(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    work = run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="128",
                      EXTFORGE_SHARD_UNITS=";".join([*SPLIT, "flash_bwd_hdim64_fp16_sm80"]))
    units = listed_units(work / "setup.py")
    twins = [u + "_shard1" for u in SPLIT]
    # The head-dim-64 unit is not built, so it is not split either.
    assert len(units) == 13 + 3 and set(twins) <= set(units) and "flash_bwd_hdim64_fp16_sm80_shard1" not in units
    src = work / "csrc/flash_attn/src"
    assert all((src / f"{t}.cu").is_file() for t in twins) and not (src / "flash_bwd_hdim64_fp16_sm80_shard1.cu").exists()
    # Every head dim's launcher gets the parameter (a header is shared), flash.h and flash_api.cpp do not change.
    assert (src / "flash_fwd_launch_template.h").read_text().count("int Shard = -1>") == 6 + 1
    assert (src / "flash_bwd_launch_template.h").read_text().count("int Shard = -1>") == 6
    for same in ("csrc/flash_attn/src/flash.h", "csrc/flash_attn/flash_api.cpp"):
        assert (work / same).read_text() == (sdist / same).read_text()


def test_a_unit_of_another_shape_is_refused_before_compiling(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    src = tmp_path / "sdist"
    shutil.copytree(sdist, src)
    unit = src / "csrc/flash_attn/src/flash_bwd_hdim128_fp16_sm80.cu"
    unit.write_text(unit.read_text().replace("(params, stream);", "(params, stream, 0);"))
    proc = subprocess.run([sys.executable, str(recipe_dir / "select_sources.py"), str(src)], capture_output=True, text=True,
                          env={**os.environ, "FLASH_ATTN_HEAD_DIMS": "128", "EXTFORGE_UNIT_ORDER": "",
                               "EXTFORGE_SHARD_UNITS": "flash_bwd_hdim128_fp16_sm80"})
    assert proc.returncode != 0 and "the unit split does not fit this flash-attn version" in proc.stderr
    assert "Traceback" not in proc.stderr


def _through_ccache(work: Path) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, environment) that carry a compile in `work` through ccache where it is
    installed, its cache kept with extforge's test fixtures: a later run compiles again only what
    select_sources.py's output, the headers or the flags changed (two flash-attn units are ~150 s
    of nvcc on 2 cores, flash_api.cpp ~40 s of g++). The work folder's path is left out of the hash (CCACHE_BASEDIR)."""
    found = shutil.which("ccache")
    if found is None:
        return [], dict(os.environ)
    return [found], {**os.environ, "CCACHE_DIR": str(cache_root() / "test-fixtures" / "ccache"),
                     "CCACHE_BASEDIR": str(work), "CCACHE_NOHASHDIR": "1"}


def _nvcc_objects(work: Path, torch: Path, units: list[str], std: str) -> dict[str, str]:
    """Each unit compiled by nvcc as torch's BuildExtension would (two at once), with the -std= flag
    the build layer raises upstream's to, as `nm -C`. PTX only (compute_90): the symbols checked
    are the host side's, which ptxas would not change (a fifth of the test's time)."""
    launcher, env = _through_ccache(work)
    # nvcc's own toolkit headers, not the nvidia wheels' (another CUDA minor: CCCL refuses the mix).
    include = ["csrc/flash_attn", "csrc/flash_attn/src", "csrc/cutlass/include", f"{torch}/torch/include",
               f"{torch}/torch/include/torch/csrc/api/include", sysconfig.get_paths()["include"]]
    procs = {u: subprocess.Popen(
        [*launcher, "nvcc", "-c", f"csrc/flash_attn/src/{u}.cu", "-o", f"{u}.o", "-O3", std, "--expt-relaxed-constexpr",
         "--expt-extended-lambda", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
         "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__", "--compiler-options=-fPIC",
         "-gencode", "arch=compute_90,code=compute_90", "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda", *[f"-I{i}" for i in include]],
        cwd=work, env=env, stderr=subprocess.PIPE, text=True) for u in units}
    for u, p in procs.items():
        assert p.wait() == 0, f"nvcc {u}: {p.stderr.read()[-2000:]}"
    return {u: subprocess.run(["nm", "-C", f"{u}.o"], cwd=work, capture_output=True, text=True, check=True).stdout
            for u in units}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_split_unit_compiles_each_side_of_its_switch_once(recipe_dir: Path, sdist: Path, tmp_path: Path) -> None:
    """The cheapest kernel unit split for real: the unit keeps the kernels without dropout and
    calls the dropout side, which only its twin defines. (Upstream runs softcap without dropout,
    so the dropout side's softcap kernels are the unit's own, compiled in both.) Against torch
    2.14.1's headers, which refuse upstream's -std=c++17: the standard the build layer derives compiles."""
    torch = torch_headers("2.14.1")
    if torch is None:
        pytest.skip("no torch 2.14.1 wheel in the cache (tests/audit installs one)")
    unit = "flash_fwd_hdim32_fp16_causal_sm80"
    work = run_select(recipe_dir, sdist, tmp_path, FLASH_ATTN_HEAD_DIMS="32", EXTFORGE_SHARD_UNITS=unit)
    std = cxx_std(torch)
    assert std == "c++20"
    syms = _nvcc_objects(work, torch, [unit, unit + "_shard1"], f"-std={std}")
    side1 = "run_mha_fwd_hdim32<cutlass::half_t, true, 1>(flash::Flash_fwd_params&, CUstream_st*)"
    assert re.search(rf"^\s+U void flash::{re.escape(side1)}$", syms[unit], re.M), "the unit must call side 1, not define it"
    assert re.search(rf"^[0-9a-f]+ [TW] void flash::{re.escape(side1)}$", syms[unit + "_shard1"], re.M)
    # flash_fwd_kernel<Kernel_traits<..., Flash_kernel_traits<...> >, Is_dropout, ...>: the kernels' host stubs.
    dropout = {u: set(re.findall(r"flash_fwd_kernel<Flash_fwd_kernel_traits<[^<>]*<[^<>]*> >, (true|false),", s))
               for u, s in syms.items()}
    assert dropout[unit] == {"false"} and "true" in dropout[unit + "_shard1"]


# Upstream's shape: the extension appended to ext_modules, one quoted source per line.
MINI_SETUP = '''from setuptools import Extension, setup

ext_modules = []
if True:
    ext_modules.append(
        Extension(
            name="flash_attn_2_cuda",
            sources=[
                "csrc/flash_attn/src/alpha.cpp",
                "csrc/flash_attn/src/mid.cpp",
                "csrc/flash_attn/src/zeta.cpp",
            ],
        )
    )
setup(name="mini", ext_modules=ext_modules)
'''


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_setuptools_compiles_the_sources_in_the_planned_order(recipe_dir: Path, tmp_path: Path) -> None:
    """setuptools sorts an extension's sources by name before compiling them (that is why the
    split-kv units, flash_fwd_split_*, started last on the node whatever setup.py listed); the
    sources select_sources.py ranks keep the planned order through that sort."""
    src = tmp_path / "csrc/flash_attn/src"
    src.mkdir(parents=True)
    for unit in ("alpha", "mid", "zeta"):
        (src / f"{unit}.cpp").write_text(f"int {unit}() {{ return 1; }}\n")
    (tmp_path / "setup.py").write_text(MINI_SETUP)

    def compile_order(root: Path) -> list[str]:
        out = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "--force"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        return re.findall(r"-c csrc/flash_attn/src/(\w+)\.cpp", out)

    plain = tmp_path / "plain"
    shutil.copytree(tmp_path, plain, ignore=shutil.ignore_patterns("plain"))
    subprocess.run([sys.executable, str(recipe_dir / "select_sources.py"), str(tmp_path)], check=True,
                   env={**os.environ, "FLASH_ATTN_HEAD_DIMS": "", "EXTFORGE_UNIT_ORDER": "zeta;alpha;mid"})
    assert compile_order(plain) == ["alpha", "mid", "zeta"]  # by name, whatever the list says
    assert compile_order(tmp_path) == ["zeta", "alpha", "mid"]
