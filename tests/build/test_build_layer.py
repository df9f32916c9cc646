"""The build layer (extforge-torch-build) piece by piece, with real processes: the nvcc wrapper
around the real nvcc (the object's fatbin read back), the network refusal in a real interpreter,
upstream's build files scanned, a build that tries to download failing inside rattler-build, and
a build stopped by SIGTERM. demo-ext's build (tests/build/test_demo_pipeline.py) is the layer on
every seed row."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from build_logs import build_log
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.errors import ExtforgeError
from extforge.fatbin import arch_sets, parse_fatbin
from extforge.recipes import build_layer

LAYER = Path(build_layer.__file__).parents[1] / "data" / "torch-build"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
needs_nvcc = pytest.mark.skipif(not Path(NVCC).exists(), reason="no nvcc on this machine")

KERNEL = "__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def wrapper_env(tmp_path: Path, archs: str = "9.0", **extra: str) -> dict[str, str]:
    gencodes, names, _ = subprocess.run([sys.executable, str(LAYER / "archs.py"), archs], capture_output=True,
                                        text=True, check=True).stdout.split()
    return {**os.environ, "EXTFORGE_LAYER_SHARE": str(LAYER), "EXTFORGE_REAL_NVCC": NVCC, "EXTFORGE_REWRITES_LOG": str(tmp_path / "rewrites.log"),
            "EXTFORGE_GENCODE_LIST": gencodes, "EXTFORGE_ARCH_NAMES": names, "TORCH_CUDA_ARCH_LIST": archs,
            "NVCC_THREADS": "1", "EXTFORGE_CXX_STD": "c++17", **extra}


def fatbin_archs(obj: Path) -> tuple[list[str], list[str]]:
    with obj.open("rb") as fh:
        section = ELFFile(fh).get_section_by_name(".nv_fatbin")
        return arch_sets(parse_fatbin(section.data()))


def test_arch_lists_become_nvcc_flags_the_audit_names_and_cmake_archs() -> None:
    def parse(value: str) -> list[str]:
        proc = subprocess.run([sys.executable, str(LAYER / "archs.py"), value], capture_output=True, text=True)
        return proc.stdout.split() if proc.returncode == 0 else [proc.stderr.strip()]

    assert parse("8.0;9.0+PTX") == ["arch=compute_80,code=sm_80;arch=compute_90,code=sm_90;arch=compute_90,code=compute_90",
                                    "sm_80,sm_90,compute_90", "80-real;90"]
    assert parse("9.0a") == ["arch=compute_90a,code=sm_90a", "sm_90a", "90a-real"]
    assert parse("Hopper") == ["error: Hopper is not a compute capability like 9.0, 9.0a or 9.0+PTX"]


@needs_nvcc
def test_upstream_arch_threads_and_std_flags_are_replaced_on_the_real_nvcc(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(KERNEL)
    # causal-conv1d's setup.py: its own -gencode list and --threads 4; mamba-ssm's -std=c++14-style pins.
    subprocess.run([str(LAYER / "extforge-nvcc"), "-c", "k.cu", "-o", "k.o", "-gencode", "arch=compute_75,code=sm_75",
                    "-gencode=arch=compute_80,code=sm_80", "--threads", "4", "-std=c++14"],
                   cwd=tmp_path, env=wrapper_env(tmp_path), check=True)
    assert fatbin_archs(tmp_path / "k.o") == (["sm_90"], [])
    assert (tmp_path / "rewrites.log").read_text().splitlines() == [
        "arch: -gencode arch=compute_75,code=sm_75", "arch: -gencode=arch=compute_80,code=sm_80",
        "threads: --threads 4", "std: -std=c++14"]


@pytest.mark.parametrize(("std", "passed"), [("c++14", "c++20"), ("gnu++17", "c++20"), ("c++20", "c++20"),
                                           ("gnu++20", "gnu++20"), ("c++23", "c++23")])
def test_both_compiler_wrappers_raise_a_standard_below_torchs_alike(tmp_path: Path, std: str, passed: str) -> None:
    shows_args = tmp_path / "shows-args"
    shows_args.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    shows_args.chmod(0o755)
    env = wrapper_env(tmp_path, EXTFORGE_REAL_NVCC=str(shows_args), EXTFORGE_CXX_STD="c++20")
    for wrapper in ([str(LAYER / "extforge-nvcc")], [str(LAYER / "cxx-wrapper.sh"), str(shows_args)]):
        args = subprocess.run([*wrapper, f"-std={std}", "-E", "k.cu"], env=env, capture_output=True, text=True,
                              check=True).stdout.split()
        assert args == [f"-std={passed}", "-E", "k.cu"], wrapper
    # Noted once for the build record, whichever wrapper met it first.
    log = tmp_path / "rewrites.log"
    assert (log.read_text().splitlines() if log.exists() else []) == ([f"std: -std={std}"] if passed != std else [])


@needs_nvcc
def test_a_foreign_arch_is_refused_when_the_recipe_asks_for_refusal(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(KERNEL)
    proc = subprocess.run([str(LAYER / "extforge-nvcc"), "-c", "k.cu", "-o", "k.o", "-arch=sm_80"], cwd=tmp_path,
                          env=wrapper_env(tmp_path, EXTFORGE_ARCH_FLAGS="refuse"), capture_output=True, text=True)
    assert proc.returncode == 1 and not (tmp_path / "k.o").exists()
    assert "upstream passes '-arch=sm_80' but the variant's archs are sm_90" in proc.stderr


@needs_nvcc
def test_units_that_compile_for_archs_of_their_own_keep_those_the_variant_names(tmp_path: Path) -> None:
    """FlashAttention-3's shape (EXTFORGE_ARCH_FLAGS=within): `_sm80.cu` units for sm_80, the rest
    for sm_90a, a few for both. Rewritten as every other recipe's, each unit compiled for every
    arch of the variant (the Hopper kernels for sm_80 too: twice the work, or no compile at all)."""
    (tmp_path / "k.cu").write_text(KERNEL)
    env = wrapper_env(tmp_path, "8.0;9.0a", EXTFORGE_ARCH_FLAGS="within")

    def nvcc(*flags: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(LAYER / "extforge-nvcc"), "-c", "k.cu", "-o", "k.o", *flags], cwd=tmp_path,
                              env=env | extra, capture_output=True, text=True)

    assert nvcc("-gencode", "arch=compute_80,code=sm_80").returncode == 0
    assert fatbin_archs(tmp_path / "k.o") == (["sm_80"], [])
    # A unit for both, on a variant of Hopper alone: the arch it does not name is dropped, and said.
    hopper = wrapper_env(tmp_path, "9.0a", EXTFORGE_ARCH_FLAGS="within")
    assert nvcc("-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_80,code=sm_80", **hopper).returncode == 0
    assert fatbin_archs(tmp_path / "k.o") == (["sm_90a"], [])
    assert "arch: -gencode arch=compute_80,code=sm_80" in (tmp_path / "rewrites.log").read_text().splitlines()
    # A unit written for an arch the variant does not name is refused, not compiled for another.
    (tmp_path / "k.o").unlink()
    refused = nvcc("-gencode", "arch=compute_80,code=sm_80", **hopper)
    assert refused.returncode == 1 and not (tmp_path / "k.o").exists()
    assert "this compile names none of the variant's archs sm_90a" in refused.stderr


def test_a_recipes_own_facts_join_the_build_record_and_never_replace_the_layers(tmp_path: Path) -> None:
    """flash-attn and FA3 wrote records of their own (a heredoc in each build.sh); on the layer
    they add their facts (the subset built) to its record through EXTFORGE_RECORD_EXTRA."""
    extra = tmp_path / "record-extra.json"
    extra.write_text(json.dumps({"subset": {"head_dims": [128]}, "network": "none", "torch": "9.9"}))
    env = {"PATH": os.environ["PATH"], "PREFIX": str(tmp_path / "prefix"), "SRC_DIR": str(tmp_path), "PKG_NAME": "fa",
           "EXTFORGE_RECORD_EXTRA": str(extra), "EXTFORGE_NETWORK": "namespace", "EXTFORGE_TORCH_VERSION": "2.14.1",
           "EXTFORGE_ARCH_NAMES": "sm_90a", "TORCH_CUDA_ARCH_LIST": "9.0a"}
    subprocess.run([sys.executable, str(LAYER / "record.py")], env=env, check=True)
    record = json.loads((tmp_path / "prefix" / "share" / "extforge" / "build" / "fa.json").read_text())
    assert record["subset"] == {"head_dims": [128]}
    assert (record["network"], record["torch"], record["cuda_archs"]) == ("namespace", "2.14.1", ["sm_90a"])
    extra.write_text("[1, 2]")
    bad = subprocess.run([sys.executable, str(LAYER / "record.py")], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "holds no JSON object" in bad.stderr


# causal-conv1d's shape: one kernel template, instantiated explicitly for each type pair.
TEMPLATED = """#include "scale.h"
template <typename T, typename W> __global__ void scale(T *x, W w) { x[threadIdx.x] *= SCALE * w; }
template <typename T, typename W> void launch(T *x, W w) { scale<T, W><<<1, 32>>>(x, w); }
template void launch<float, float>(float *x, float w);
template void launch<double, float>(double *x, float w);
template void launch<float,
                     double>(float *x, double w);
template void launch<double, double>(double *x, double w);
"""


def host_symbols(obj: Path, *flags: str) -> list[str]:
    listed = subprocess.run(["nm", "--defined-only", *flags, str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in listed.splitlines())


def kernels(obj: Path) -> list[str]:
    """The kernels the object launches: the host side of each `scale<T, W>` (local to its unit)."""
    return [s for s in host_symbols(obj) if s.startswith("_Z5scale")]


def cubins(obj: Path) -> int:
    with obj.open("rb") as fh:
        return len(parse_fatbin(ELFFile(fh).get_section_by_name(".nv_fatbin").data()))


@needs_nvcc
def test_a_unit_the_planner_splits_compiles_as_parts_into_the_same_object(tmp_path: Path) -> None:
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "scale.h").write_text("#define SCALE 2\n")  # found beside upstream's file, as from a part
    (src / "conv.cu").write_text(TEMPLATED)
    compile_line = ["-c", str(src / "conv.cu"), "-o", str(tmp_path / "conv.o"), "--dependency-output",
                    str(tmp_path / "conv.o.d"), "--generate-dependencies-with-compile"]
    subprocess.run([str(LAYER / "extforge-nvcc"), *compile_line], env=wrapper_env(tmp_path), check=True)
    whole = tmp_path / "whole.o"
    (tmp_path / "conv.o").rename(whole)
    split_log = tmp_path / "split.log"
    subprocess.run([str(LAYER / "extforge-nvcc"), *compile_line], check=True,
                   env=wrapper_env(tmp_path, EXTFORGE_SPLIT_UNITS="other=3;conv=3", EXTFORGE_SPLIT_LOG=str(split_log)))
    obj = tmp_path / "conv.o"
    # Every kernel and host instantiation the whole unit had, its code for the variant's arch,
    # from three compiles (one per part) joined into the object ninja asked for.
    assert len(kernels(whole)) == 4 and kernels(obj) == kernels(whole)
    assert host_symbols(obj, "-g") == host_symbols(whole, "-g")
    assert fatbin_archs(obj) == (["sm_90"], []) and (cubins(whole), cubins(obj)) == (1, 3)
    record = json.loads(split_log.read_text())
    assert record["unit"] == "conv" and record["parts"] == 3 and record["instantiations"] == 4
    assert len(record["seconds"]) == 3 and "compiled_whole" not in record
    # ninja's dependency file names upstream's source, not a part.
    deps = (tmp_path / "conv.o.d").read_text()
    assert str(src / "conv.cu") in deps and "scale.h" in deps and "extforge-part" not in deps
    assert "split: conv in up to 3 parts" in (tmp_path / "rewrites.log").read_text()
    assert sorted(p.name for p in tmp_path.glob("conv.o*")) == ["conv.o", "conv.o.d"]


@needs_nvcc
def test_a_unit_whose_parts_would_define_a_symbol_twice_or_cannot_be_joined_is_compiled_whole(tmp_path: Path) -> None:
    (tmp_path / "scale.h").write_text("#define SCALE 2\n")
    (tmp_path / "conv.cu").write_text(TEMPLATED + "int conv_version() { return 1; }\n")
    split_log = tmp_path / "split.log"
    subprocess.run([str(LAYER / "extforge-nvcc"), "-c", "conv.cu", "-o", "conv.o"], cwd=tmp_path, check=True,
                   env=wrapper_env(tmp_path, EXTFORGE_SPLIT_UNITS="conv=2", EXTFORGE_SPLIT_LOG=str(split_log)))
    record = json.loads(split_log.read_text())
    assert record["parts"] == 1 and record["compiled_whole"].startswith("1 symbol(s) defined in more than one part")
    assert "_Z12conv_versionv" in record["compiled_whole"]
    assert len(kernels(tmp_path / "conv.o")) == 4 and host_symbols(tmp_path / "conv.o", "-g").count("_Z12conv_versionv") == 1
    # Parts that cannot be joined (no linker here) are not a failed build either.
    (tmp_path / "conv.cu").write_text(TEMPLATED)
    split_log.unlink()
    subprocess.run([str(LAYER / "extforge-nvcc"), "-c", "conv.cu", "-o", "conv.o"], cwd=tmp_path, check=True,
                   env=wrapper_env(tmp_path, EXTFORGE_SPLIT_UNITS="conv=2", EXTFORGE_SPLIT_LOG=str(split_log),
                                   LD=str(tmp_path / "no-such-ld")))
    record = json.loads(split_log.read_text())
    assert record["parts"] == 1 and record["compiled_whole"].startswith("the parts could not be joined: ")
    assert len(kernels(tmp_path / "conv.o")) == 4


def test_upstream_build_files_are_named_before_the_compile(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text(
        'cc_flag = []\ncc_flag.append("-gencode")\ncc_flag.append("arch=compute_75,code=sm_75")\n'
        'cc_flag += ["-gencode", "arch=compute_90,code=sm_90"]\nnvcc = ["--threads", "4", "-std=c++17"]\n')
    scan = [sys.executable, str(LAYER / "scan_flags.py"), str(tmp_path)]
    noted = subprocess.run([*scan, "rewrite", "sm_90"], capture_output=True, text=True)
    assert noted.returncode == 0
    assert "setup.py:3: arch=compute_75,code=sm_75: an arch outside the variant's, replaced at each compile by sm_90" in noted.stderr
    assert "compute_90" not in noted.stderr.split("setup.py:4")[-1].split("\n")[0]
    assert "setup.py:5: nvcc --threads 4 (NVCC_THREADS wins)" in noted.stderr
    refused = subprocess.run([*scan, "refuse", "sm_90"], capture_output=True, text=True)
    assert refused.returncode == 1 and "setup.py:3" in refused.stderr and "refused" in refused.stderr


def test_no_python_process_of_a_build_reaches_the_network(tmp_path: Path) -> None:
    # flash-attn's and causal-conv1d's setup.py catch urllib's errors and build instead, or retry;
    # the refusal is not an error they catch, and it is recorded for the end-of-build check.
    script = ("import urllib.request, urllib.error, socket\n"
              "s = socket.socket(); s.settimeout(1)\n"
              "try:\n    s.connect(('127.0.0.1', 9))\nexcept OSError:\n    print('loopback allowed')\n"
              "try:\n    urllib.request.urlretrieve('https://github.com/x/y/releases/download/v1/pkg-1.0-cp311.whl', 'w')\n"
              "except (urllib.error.HTTPError, urllib.error.URLError):\n    print('fell back')\n")
    (tmp_path / "setup.py").write_text(script)
    log = tmp_path / "network.log"
    proc = subprocess.run([sys.executable, "setup.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(LAYER / "python"), "EXTFORGE_NETWORK_LOG": str(log)})
    assert proc.returncode == 1 and "loopback allowed" in proc.stdout and "fell back" not in proc.stdout
    assert "network access during a build is refused: github.com from setup.py:8" in proc.stderr
    assert log.read_text().startswith("github.com from setup.py:8")


def test_known_download_switches_are_data_and_found_from_the_url() -> None:
    url = ("Guessing wheel URL:  https://github.com/Dao-AILab/causal-conv1d/releases/download/v1.7.0/"
           "causal_conv1d-1.7.0+cu13torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")
    switch = build_layer.switch_for(url)
    assert switch is not None and switch.package == "causal-conv1d"
    assert switch.assignment() == "CAUSAL_CONV1D_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=FALSE"
    assert build_layer.switch_for("flash_attn-2.8.3+cu12torch2.6-cp312.whl").package == "flash-attn"
    assert build_layer.switch_for("no wheel here") is None
    fht = build_layer.switch_for("fast_hadamard_transform-1.1.0+cu12torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")
    assert fht is not None and fht.assignment().startswith("FAST_HADAMARD_TRANSFORM_FORCE_BUILD=TRUE")
    assert "export MAMBA_FORCE_BUILD=TRUE" in build_layer.switches_sh()
    # The ABI switches activate.sh named package by package are data too, beside each package's
    # download switch; no recipe sets either (flash-attn's and FA3's did).
    shell = build_layer.switches_sh()
    assert ("_xf_abi_switches='FLASH_ATTENTION_FORCE_CXX11_ABI CAUSAL_CONV1D_FORCE_CXX11_ABI MAMBA_FORCE_CXX11_ABI "
            "FAST_HADAMARD_TRANSFORM_FORCE_CXX11_ABI'") in shell
    assert "FORCE_CXX11_ABI" not in (LAYER / "activate.sh").read_text()
    for recipe in (LAYER.parents[3] / "recipe").glob("*/recipe.yaml"):
        assert not any(k in recipe.read_text() for sw in build_layer.switches() for k in sw.values), recipe


def test_settings_reach_the_build_as_a_file_only_its_owner_writes(tmp_path: Path) -> None:
    path = build_layer.write_settings(tmp_path, {"MAX_JOBS": "3", "CCACHE_DIR": "/a dir/with 'quotes'"})
    assert path == tmp_path / "bld" / build_layer.SETTINGS_FILE and oct(path.stat().st_mode & 0o777) == "0o644"
    out = subprocess.run(["bash", "-c", f"source {path}; echo \"$MAX_JOBS|$CCACHE_DIR\""], capture_output=True, text=True)
    assert out.stdout.strip() == "3|/a dir/with 'quotes'"


COMPILERS = "    - ${{ compiler('c') }}\n    - ${{ compiler('cxx') }}\n    - ${{ compiler('cuda') }}\n"


def _tiny_recipe(folder: Path, setup_py: str, *, script: str, name: str = "net-probe", compilers: str = "",
                 files: dict[str, str] | None = None) -> Path:
    """A recipe that lists the layer, with torch in its host env."""
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "setup.py").write_text(setup_py)
    for rel, text in (files or {}).items():
        (folder / "src" / rel).write_text(text)
    (folder / "recipe.yaml").write_text(
        f"schema_version: 1\npackage: {{name: {name}, version: '1.0'}}\nsource: {{path: src}}\n"
        f"build:\n  script:\n    env:\n      TORCH_CUDA_ARCH_LIST: '9.0'\n    content: {script}\n"
        f"requirements:\n  build:\n{compilers}    - extforge-torch-build\n"
        "  host:\n    - python\n    - pip\n    - setuptools\n    - pytorch\n")
    return folder


@pytest.mark.slow
def test_a_build_that_tries_to_download_fails_in_the_build(tmp_path: Path, mirror_channel: Path) -> None:
    # upstream's pattern (flash-attn, causal-conv1d) without any *_FORCE_BUILD switch set: try the
    # wheel, fall back to a build on an HTTP error. Here it must fail, saying what it tried.
    recipe = _tiny_recipe(tmp_path / "net-probe", (
        "import urllib.request, urllib.error\n"
        "url = 'https://github.com/example/net-probe/releases/download/v1.0/net_probe-1.0+cu13torch2.14-cp311-cp311-linux_x86_64.whl'\n"
        "print('Guessing wheel URL: ', url)\n"
        "try:\n    urllib.request.urlretrieve(url, 'w.whl')\n"
        "except urllib.error.URLError:\n    print('Precompiled wheel not found. Building from source...')\n"),
        script="${{ PYTHON }} setup.py")
    with pytest.raises(ExtforgeError) as err:
        build_recipe(BuildOptions.make(recipe, [str(mirror_channel)], tmp_path / "out", test=False, audit=False))
    text = err.value.render()
    assert "network" in text and "github.com" in text, text
    log = build_log(tmp_path / "out", "net-probe").read_text()
    assert "network access during a build is refused: github.com from setup.py:5" in log
    assert "Building from source" not in log


@pytest.mark.slow
def test_torchs_build_without_ninja_gets_the_variants_archs_too(tmp_path: Path, mirror_channel: Path) -> None:
    # torch-scatter's shape: setuptools compiling one unit at a time (no ninja), which runs
    # $CUDA_HOME/bin/nvcc instead of PYTORCH_NVCC; upstream's own arch list and --threads beside it.
    recipe = _tiny_recipe(tmp_path / "plain-ext", (
        "from setuptools import setup\nfrom torch.utils.cpp_extension import BuildExtension, CUDAExtension\n"
        "setup(name='plain-ext', version='1.0', cmdclass={'build_ext': BuildExtension.with_options(use_ninja=False)},\n"
        "      ext_modules=[CUDAExtension('plain_ext', ['k.cu'], extra_compile_args={'cxx': [], 'nvcc': [\n"
        "          '-gencode', 'arch=compute_75,code=sm_75', '--threads', '4']})])\n"),
        name="plain-ext", compilers=COMPILERS, script="${{ PYTHON }} -m pip install . --no-deps --no-build-isolation -v",
        files={"k.cu": "#include <Python.h>\n" + KERNEL + "static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "
               "\"plain_ext\", nullptr, -1, nullptr};\nPyMODINIT_FUNC PyInit_plain_ext(void) { return PyModule_Create(&mod); }\n"})
    (built,) = build_recipe(BuildOptions.make(recipe, [str(mirror_channel)], tmp_path / "out", test=False))
    # The audit holds the package to its build record's exact list: an sm_75 cubin would fail it.
    assert built.audit_verdict == "pass", built
    log = build_log(tmp_path / "out", "plain-ext").read_text()
    assert "replaced in upstream's compile lines: arch: -gencode arch=compute_75,code=sm_75; threads: --threads 4" in log


@pytest.mark.slow
def test_sigterm_stops_a_running_build_at_once_and_says_stopped(tmp_path: Path) -> None:
    channel = tmp_path / "empty"
    (channel / "noarch").mkdir(parents=True)
    (channel / "noarch" / "repodata.json").write_text('{"info": {"subdir": "noarch"}, "packages": {}}')
    folder = tmp_path / "sleeper"
    folder.mkdir()
    marker = tmp_path / "compiling"
    (folder / "recipe.yaml").write_text(
        "schema_version: 1\npackage: {name: sleeper, version: '1.0'}\nbuild:\n  noarch: generic\n  script:\n"
        f"    - touch {marker}\n    - sleep 299.5\n")
    proc = subprocess.Popen([sys.executable, "-m", "extforge", "build", str(folder), "-c", str(channel), "-o",
                             str(tmp_path / "out"), "--no-audit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "EXTFORGE_CACHE": str(tmp_path / "cache")})
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate(timeout=10)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 20, "the build waited for its script"
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "build stopped by SIGTERM" in err and "stopped after" in err
    assert "out of memory" not in err and "failed" not in err
    assert not subprocess.run(["pgrep", "-f", "sleep 299.5"], capture_output=True).stdout
    # Its work folder (in the cache's builds area, the builder's alone) went with it.
    assert not list((tmp_path / "cache").glob("builds*/*"))


def test_tests_that_cannot_start_name_the_missing_run_requirement(tmp_path: Path) -> None:
    """A package whose run requirement no channel has (mamba-ssm without causal-conv1d) builds,
    then rattler-build's tests cannot solve their env and it says only "Test failed": the build
    names the requirement, where the package went, and the two ways on."""
    channel = tmp_path / "empty"
    (channel / "noarch").mkdir(parents=True)
    (channel / "noarch" / "repodata.json").write_text('{"info": {"subdir": "noarch"}, "packages": {}}')
    folder = tmp_path / "needs-dep"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(
        "schema_version: 1\npackage: {name: needs-dep, version: '1.0'}\nbuild:\n  noarch: generic\n  script:\n"
        "    - mkdir -p $PREFIX/share && touch $PREFIX/share/needs-dep\n"
        "requirements:\n  run:\n    - causal-conv1d >=1.2.0\ntests:\n  - script:\n      - test -f $PREFIX/share/needs-dep\n")
    proc = subprocess.run([sys.executable, "-m", "extforge", "build", str(folder), "-c", str(channel), "-o",
                           str(tmp_path / "out"), "--no-audit"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "its tests could not start: the channels have no package for causal-conv1d >=1.2.0" in proc.stderr
    assert "--no-test" in proc.stderr and "Traceback" not in proc.stderr
    kept = [f.name for f in (tmp_path / "out" / "broken").iterdir()]
    assert len(kept) == 1 and kept[0].startswith("needs-dep-1.0-") and f"out/broken/{kept[0]}" in proc.stderr


def test_recipes_inherit_the_build_string_the_archs_and_the_torch_pin() -> None:
    """Five recipes carried one 220-character build-string line each, four the same variants.yaml,
    every one the exact torch pin: they come from the layer (its build string and variants.yaml)
    and from the mirror's pytorch (run_exports) now. flash-attn and FA3 name their subsets in
    their own build strings; FA3 runs on every torch of its CUDA major (the stable C ABI)."""
    recipes = Path(__file__).resolve().parents[2] / "recipe"
    layer_variants = build_layer.variants_file().read_text().split("cuda_archs:", 1)[1]
    for recipe in sorted(recipes.glob("*/recipe.yaml")):
        text = recipe.read_text()
        assert "pin_compatible('pytorch'" not in text, recipe
        own = recipe.parent / "variants.yaml"
        assert not own.is_file() or own.read_text().split("cuda_archs:", 1)[-1] != layer_variants, own
        if recipe.parent.name not in ("flash-attn", "flash-attn-3"):
            assert "\n  string:" not in text, recipe
    assert "version_to_buildstring }}_${{ cxx_abi" in build_layer.BUILD_STRING


def test_a_torch_extension_recipe_without_the_layer_is_told_so() -> None:
    recipes = Path(__file__).resolve().parents[2] / "recipe"
    for name in ("demo-ext", "causal-conv1d", "mamba-ssm", "torch-scatter", "flash-attn", "flash-attn-3"):
        text = (recipes / name / "recipe.yaml").read_text()
        assert build_layer.builds_torch_extension(text) and build_layer.uses_layer(text), name
    bare = (recipes / "demo-ext" / "recipe.yaml").read_text().replace("    - extforge-torch-build\n", "")
    assert build_layer.builds_torch_extension(bare) and not build_layer.uses_layer(bare)
