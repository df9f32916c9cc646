"""explain on failure text produced for real on this machine: a wrong-ABI and a version-skewed
extension module imported by Python, compiles killed for memory, real `No module named` errors
from Python and from pip's isolated build."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from extforge.doctor.explain import Context, explain_text

needs_gxx = pytest.mark.skipif(not shutil.which("g++"), reason="no g++")

# A stand-in for libc10: one function taking a std::string, one taking an int.
LIB_SRC = """
#include <string>
namespace c10 {
std::string describe(const std::string& s) { return "c10: " + s; }
int device_count(int ordinal) { return ordinal + 1; }
}
"""
EXT_SRC = """
#include <Python.h>
#include <string>
namespace c10 { std::string describe(const std::string&); int device_count(%(count_arg)s); }
static PyObject* hello(PyObject*, PyObject*) {
    return PyLong_FromLong(c10::describe("x").size() + c10::device_count(0));
}
static PyMethodDef methods[] = {{"hello", hello, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mod = {PyModuleDef_HEAD_INIT, "%(name)s", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_%(name)s() { return PyModule_Create(&mod); }
"""


def _gxx(*args: str | Path) -> None:
    subprocess.run(["g++", "-shared", "-fPIC", "-O0", *map(str, args)], check=True, capture_output=True)


def import_error(tmp: Path, name: str, *, ext_abi: int, count_arg: str) -> str:
    """Build libc10stub.so with ABI 1 and an extension against it, import it, return stderr."""
    lib = tmp / "libc10stub.so"
    if not lib.exists():
        (tmp / "lib.cpp").write_text(LIB_SRC)
        _gxx("-D_GLIBCXX_USE_CXX11_ABI=1", tmp / "lib.cpp", "-o", lib)
    src = tmp / f"{name}.cpp"
    src.write_text(EXT_SRC % {"name": name, "count_arg": count_arg})
    ext = tmp / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    _gxx(f"-D_GLIBCXX_USE_CXX11_ABI={ext_abi}", f"-I{sysconfig.get_paths()['include']}", src, "-o", ext,
         f"-L{tmp}", "-lc10stub", "-Wl,-rpath,$ORIGIN")
    out = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp, capture_output=True, text=True)
    assert out.returncode == 1
    return out.stderr


@needs_gxx
def test_wrong_abi_extension(tmp_path: Path) -> None:
    text = import_error(tmp_path, "wrong_abi_ext", ext_abi=0, count_arg="int")
    assert "undefined symbol: _ZN3c108describeERKSs" in text  # the genuine loader message
    d = explain_text(text, torch_abi=True).diagnoses[0]
    assert (d.id, d.variant) == ("undefined-symbol", "abi-mismatch")
    assert d.values["demangled"].startswith("c10::describe(std::")
    assert "_GLIBCXX_USE_CXX11_ABI=0" in d.cause and "this torch uses 1" in d.cause
    assert d.values["module"].endswith(f"wrong_abi_ext{sysconfig.get_config_var('EXT_SUFFIX')}")
    # Without knowing torch, a std::string in the missing name still points at the ABI, hedged.
    unknown = explain_text(text).diagnoses[0]
    assert unknown.variant == "abi-mismatch" and "not checked" in unknown.cause


@needs_gxx
def test_version_skewed_extension(tmp_path: Path) -> None:
    # Built against a "newer c10" whose device_count takes a long; the installed one takes an int.
    text = import_error(tmp_path, "skewed_ext", ext_abi=1, count_arg="long")
    assert "undefined symbol: _ZN3c1012device_countEl" in text
    d = explain_text(text, torch_abi=True).diagnoses[0]
    assert (d.variant, d.values["demangled"]) == ("version-skew", "c10::device_count(long)")


def test_symbol_abi_matching_torch_means_skew_not_abi() -> None:
    text = "ImportError: /x/ext.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    assert explain_text(text, torch_abi=True).diagnoses[0].variant == "version-skew"
    assert explain_text(text, torch_abi=False).diagnoses[0].variant == "abi-mismatch"


NO_PLAN = Context(plan=lambda: ({"MAX_JOBS": 5, "NVCC_THREADS": 2, "predicted_peak_bytes": 1}, None))
HEAVY = "#include <regex>\n#include <iostream>\n#include <map>\nint main(){std::regex r(\"a+\"); std::cout << std::regex_match(\"aa\", r);}\n"


@needs_gxx
@pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("prlimit")), reason="needs ninja and prlimit")
def test_compile_out_of_memory_under_ninja(tmp_path: Path) -> None:
    (tmp_path / "heavy.cpp").write_text(HEAVY)
    # 200 MB of address space: cc1plus parsing <regex> needs more.
    (tmp_path / "build.ninja").write_text(
        "rule cxx\n  command = prlimit --as=200000000 g++ -c $in -o $out\nbuild heavy.o: cxx heavy.cpp\n"
    )
    out = subprocess.run(["ninja"], cwd=tmp_path, capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert "ninja: build stopped: subcommand failed." in text and "memory" in text
    found = explain_text(text, context=NO_PLAN).diagnoses
    # ninja's line is explained by the OOM, so it is not reported twice.
    assert [d.id for d in found] == ["oom-killed"]
    assert "MAX_JOBS=5 NVCC_THREADS=2" in found[0].fix


@needs_gxx
def test_compiler_killed_by_sigkill(tmp_path: Path) -> None:
    # What the kernel's OOM killer does to cc1plus: SIGKILL.
    (tmp_path / "heavy.cpp").write_text(HEAVY)
    proc = subprocess.Popen(["g++", "-c", "heavy.cpp"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    cc1plus = None
    while cc1plus is None and time.monotonic() < deadline and proc.poll() is None:
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "cc1plus":
                cc1plus = int(child)
        time.sleep(0.01)
    if cc1plus is None:
        proc.wait()
        pytest.skip("cc1plus finished before it could be killed")
    os.kill(cc1plus, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert "Killed signal terminated program cc1plus" in err
    d = explain_text(err, context=NO_PLAN).diagnoses[0]
    assert (d.id, d.values["program"]) == ("oom-killed", "cc1plus")


def test_shell_reports_a_killed_job() -> None:
    out = subprocess.run(["bash", "-c", 'sh -c "kill -9 \\$\\$"; true'], capture_output=True, text=True)
    assert " Killed " in out.stderr
    assert [d.id for d in explain_text(out.stderr, context=NO_PLAN).diagnoses] == ["oom-killed"]


@needs_gxx
@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_a_compiler_error_under_ninja_is_named_not_blamed_on_memory(tmp_path: Path) -> None:
    # ninja prints FAILED and the command first, then the compiler's own output.
    (tmp_path / "ok.cpp").write_text("int ok() { return 1; }\n")
    (tmp_path / "bad.cpp").write_text("#include <compare>\nauto f() { return std::strong_orderin::equal; }\n")
    (tmp_path / "build.ninja").write_text(
        "rule cxx\n  command = g++ -std=c++20 -c $in -o $out\nbuild ok.o: cxx ok.cpp\nbuild bad.o: cxx bad.cpp\n")
    out = subprocess.run(["ninja", "-j", "1"], cwd=tmp_path, capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert "ninja: build stopped: subcommand failed." in text
    d = explain_text(text, context=NO_PLAN).diagnoses[0]
    assert (d.id, d.variant, d.values["target"]) == ("ninja-build-stopped", "compiler-error", "bad.o")
    assert "bad.cpp:2" in d.cause and "strong_orderin" in d.cause and "MAX_JOBS" not in d.fix


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_a_source_missing_from_the_archive_is_named(tmp_path: Path) -> None:
    """fast-hadamard-transform 1.1.0's sdist lacks the csrc/ its setup.py compiles: ninja says so
    before any compile, and the old explain (and the build's error) recognised nothing, leaving
    rattler-build's "Script failed to execute"."""
    (tmp_path / "build.ninja").write_text("rule cxx\n  command = g++ -c $in -o $out\n"
                                          "build fht.o: cxx csrc/fast_hadamard_transform.cpp\n")
    out = subprocess.run(["ninja", "-j", "1"], cwd=tmp_path, capture_output=True, text=True)
    d = explain_text(out.stdout + out.stderr, context=NO_PLAN).diagnoses[0]
    assert (d.id, d.values["path"]) == ("source-missing", "csrc/fast_hadamard_transform.cpp")
    assert "archive of the release's tag" in d.fix


def test_without_a_planner_the_fix_falls_back_to_one_job() -> None:
    ctx = Context(plan=lambda: (None, "planner unavailable (test)"))
    d = explain_text("ninja: build stopped: subcommand failed.", context=ctx).diagnoses[0]
    assert d.id == "ninja-build-stopped" and "MAX_JOBS=1 NVCC_THREADS=1" in d.fix and "planner unavailable" in d.fix


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True)
    return root


def test_no_module_named_packaging(bare_env: Path) -> None:
    out = subprocess.run([str(bare_env / "env/bin/python"), "-c", "import packaging"], capture_output=True, text=True)
    assert "ModuleNotFoundError: No module named 'packaging'" in out.stderr
    d = explain_text(out.stderr).diagnoses[0]
    assert (d.id, d.values["missing"]) == ("build-isolation", "packaging")
    assert "--no-build-isolation" in d.fix


def test_flash_attn_without_its_extension(bare_env: Path) -> None:
    pkg = bare_env / "site" / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import flash_attn_2_cuda as flash_attn_gpu\n")
    out = subprocess.run(
        [str(bare_env / "env/bin/python"), "-c", "import flash_attn"],
        capture_output=True, text=True, env={"PYTHONPATH": str(bare_env / "site")},
    )
    assert "No module named 'flash_attn_2_cuda'" in out.stderr
    assert [d.id for d in explain_text(out.stderr).diagnoses] == ["flash-attn-extension-missing"]


@pytest.mark.slow  # pip sets up an isolated build env: ~10-20 s on 2 shared cores
def test_pip_isolated_build_cannot_see_torch(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("import torch\nfrom setuptools import setup\nsetup(name='needs-torch', version='0.1')\n")
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "out"), str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    text = out.stdout + out.stderr
    if "No module named 'torch'" not in text:
        pytest.skip(f"pip could not set up the isolated build here: {text.strip().splitlines()[-1:]}")
    assert "Getting requirements to build wheel did not run successfully" in text
    d = explain_text(text).diagnoses[0]
    assert (d.id, d.values["missing"]) == ("build-isolation", "torch")
