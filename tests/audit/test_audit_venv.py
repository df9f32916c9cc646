"""`extforge audit WHEEL --against VENV`: a wheel checked against a pip venv's torch (torch/lib in
site-packages, as pip's torch lays it out), by its own words (Requires-Dist, the version label,
its tags) and by its binary (unresolved c10:: symbols, the manylinux floor).

The torch here is a stand-in compiled by g++: a libc10.so whose release 2.14 lacks a function
that the 2.11 one the extension was linked against has."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge.audit import audit_target

C10_OLD = "namespace c10 { int dispatch_v211(int x) { return x + 1; } int common(int x) { return x; } }\n"
C10_NEW = "namespace c10 { int common(int x) { return x; } }\n"
EXT = r"""
#include <string>
namespace c10 { int dispatch_v211(int); int common(int); }
extern "C" int ext_entry(int n) { std::string s(n, 'x'); return c10::dispatch_v211(c10::common((int)s.size())); }
"""
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def _gxx(out: Path, source: str, *flags: str) -> Path:
    src = out.with_suffix(".cpp")
    src.write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True)
    return out


def _venv_with_torch(root: Path, c10_source: str, version: str) -> Path:
    """A real venv whose site-packages holds torch/lib/libc10.so and torch/version.py, as pip lays them out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python3*/site-packages")
    (site / "torch" / "lib").mkdir(parents=True)
    _gxx(site / "torch" / "lib" / "libc10.so", c10_source, "-Wl,-soname,libc10.so")
    (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda: str = '13.0'\n")
    return root


def _wheel(dest: Path, so: Path, version: str, tag: str, requires: list[str]) -> Path:
    name = f"demo_ext-{version}-{tag}.whl"
    info = f"demo_ext-{version}.dist-info"
    with zipfile.ZipFile(dest / name, "w") as zf:
        zf.write(so, f"demo_ext/_C.cpython-{CP[2:]}-x86_64-linux-gnu.so")
        zf.writestr("demo_ext/__init__.py", "from ._C import *\n")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: demo-ext\nVersion: " + version + "\n"
                    + "".join(f"Requires-Dist: {r}\n" for r in requires))
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{info}/RECORD", "")
    return dest / name


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-venv")
    old_lib = root / "torch211"
    old_lib.mkdir()
    _gxx(old_lib / "libc10.so", C10_OLD, "-Wl,-soname,libc10.so")
    ext = _gxx(root / "ext.so", EXT, "-L", str(old_lib), "-lc10")
    return root, ext


def test_a_wheel_for_another_torch_is_named_with_the_fix(built, tmp_path):
    """The old code reported the unresolved symbol with a recipe's fix (pin_compatible) and never
    said that the wheel names another torch; now both say to install the wheel of the venv's torch row."""
    root, ext = built
    venv = _venv_with_torch(tmp_path / "venv", C10_NEW, "2.14.1+cu130")
    wheel = _wheel(tmp_path, ext, "1.0+cu130torch2.11cxx11abiTRUE", f"{CP}-{CP}-linux_x86_64", ["torch==2.11.0"])
    report = audit_target(wheel, against=venv)
    assert report.against_kind == "venv" and report.torch == "2.14.1+cu130"
    (pinned,) = [f for f in report.errors if f.check == "packaging"]
    assert pinned.message.startswith("demo_ext 1.0+cu130torch2.11cxx11abiTRUE is built for another torch "
                                     "(Requires-Dist: torch==2.11.0; version label +cu130torch2.11cxx11abiTRUE)")
    assert "install the build of demo_ext for torch 2.14.1" in pinned.fix and "torch2.14.1-cu130/simple" in pinned.fix
    (symbol,) = [f for f in report.errors if f.check == "symbols"]
    assert symbol.symbol == "c10::dispatch_v211(int)" and symbol.library == "libc10.so"
    assert symbol.cause.startswith("torch version skew")
    assert symbol.fix.startswith("install the wheel built for the target's torch (2.14.1+cu130)")

    good = _venv_with_torch(tmp_path / "venv211", C10_OLD, "2.11.0+cu130")
    report = audit_target(wheel, against=good)
    assert report.ok, report.render()


def test_the_python_tag_and_the_manylinux_floor_are_held_to_the_wheel(built, tmp_path):
    root, ext = built
    venv = _venv_with_torch(tmp_path / "venv", C10_OLD, "2.11.0+cu130")
    other = "cp310" if CP != "cp310" else "cp312"
    wheel = _wheel(tmp_path, ext, "1.0", f"{other}-{other}-manylinux_2_17_x86_64", ["torch==2.11.0"])
    report = audit_target(wheel, against=venv)
    messages = [f.message for f in report.errors]
    assert f"demo_ext is built for {other}; the environment runs Python {PY}" in messages
    # std::string of the new ABI needs GLIBCXX_3.4.21; the manylinux_2_17 promise (CentOS 7) has 3.4.19.
    assert any(m.startswith("demo_ext/_C.cpython") and "needs GLIBCXX_3.4" in m and "glibc 2.17" in m for m in messages), messages


def test_a_folder_that_is_no_environment_is_refused_by_the_cli(built, tmp_path):
    root, ext = built
    wheel = _wheel(tmp_path, ext, "1.0", f"{CP}-{CP}-linux_x86_64", [])
    (tmp_path / "empty").mkdir()
    res = run_extforge("audit", str(wheel), "--against", str(tmp_path / "empty"), "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"] == f"{tmp_path / 'empty'} is neither a venv (no pyvenv.cfg) nor a conda prefix (no conda-meta)"


def test_a_venv_with_system_site_packages_is_audited_with_its_bases_torch(built, tmp_path):
    """A venv made with --system-site-packages on a prefix holding pip's torch (a conda env, the
    guide's user): its python finds torch in the base's site-packages, and so does the audit. The
    old code looked in the venv's own site-packages alone: no torch, libc10.so not found."""
    root, ext = built
    base = _venv_with_torch(tmp_path / "base", C10_OLD, "2.11.0+cu130")
    venv = tmp_path / "venv"
    (venv / "lib" / f"python{PY}" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = true\nversion = {PY}\n")
    wheel = _wheel(tmp_path, ext, "1.0+cu130torch2.11cxx11abiTRUE", f"{CP}-{CP}-linux_x86_64", ["torch==2.11.0"])
    report = audit_target(wheel, against=venv)
    assert (report.against_kind, report.torch) == ("venv", "2.11.0+cu130")
    assert report.ok, report.render()
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\nversion = {PY}\n")
    assert not audit_target(wheel, against=venv).ok
