"""The co-tenant's edits, planted in a real installed demo-ext environment (python, torch, the
nvidia-* libraries, the extension): each one is a finding of `verify` that names the path."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from extforge.environment.receipt import receipt_path

from .conftest import Sandbox
from .demo_env import InstalledDemo
from .pyish import conda_meta

pytestmark = pytest.mark.slow

SITE = "lib/python3.11/site-packages"
EVIL_SOURCE = "import os\nos.system('id > /tmp/owned')\n"


@pytest.fixture
def sandbox(installed_demo: InstalledDemo) -> Sandbox:
    """The installed env's sandbox: its cache holds the key that signed the env's install record."""
    return installed_demo.sandbox


@pytest.fixture
def demo_env(installed_demo: InstalledDemo) -> tuple[Path, Path]:
    """(pixi.lock, prefix) of demo-ext and its torch, installed by `extforge install`: the session's
    install, restored as install left it before each test."""
    return installed_demo.borrow()


def _verify(sandbox, prefix: Path, *args: str, expect: int) -> dict[str, list[str]]:
    res = sandbox.run("verify", str(prefix), *args, "--json", expect=expect)
    return {c["name"]: c["findings"] for c in json.loads(res.stdout)["checks"]}


def _pyc_of(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def test_demo_env_byte_code_is_shipped_or_compiled_and_every_planted_edit_is_reported(sandbox, demo_env):
    lock, prefix = demo_env
    record = json.loads(receipt_path(prefix).read_text())
    # The mirror's packages ship their byte code, as conda-forge's do: install left each package's
    # .pyc as it is (linked from the package cache) and compiled only modules that name the
    # prefix, the interpreter's build configuration among them.
    pyc = _pyc_of(prefix / SITE / "torch" / "functional.py")
    for shipped in (pyc, _pyc_of(prefix / "lib/python3.11/json/__init__.py")):
        assert shipped.relative_to(prefix).as_posix() not in record["written"] and shipped.stat().st_nlink > 1
    assert any("/__pycache__/_sysconfigdata" in p for p in record["written"]), record["written"]
    # Importing writes nothing: every module has its recorded .pyc (the prefix stays as verified).
    python = str(prefix / "bin" / "python")
    subprocess.run([python, "-c", "import demo_ext, json, email.mime.text"], check=True, capture_output=True)
    _verify(sandbox, prefix, expect=0)

    # 1. A .pyc of other code, with its source's header (the source's hash): what Python checks.
    compiled = sandbox.path("evil") / "__init__.py"
    compiled.write_text(EVIL_SOURCE)
    subprocess.run([python, "-c", f"import py_compile; py_compile.compile({str(compiled)!r}, cfile={str(compiled) + 'c'!r})"], check=True)
    evil = bytearray(Path(f"{compiled}c").read_bytes())
    evil[4:16] = pyc.read_bytes()[4:16]
    pyc.unlink()
    pyc.write_bytes(bytes(evil))
    planted_pyc = _pyc_of(prefix / SITE / "torch" / "version.py").with_name("planted.cpython-311.pyc")
    shutil.copy(pyc, planted_pyc)
    # 2. Libraries, scripts and programs no package has, deep in owned folders and outside them.
    deep_lib = prefix / SITE / "nvidia" / "cudnn" / "lib" / "libcudart.so.13"
    assert deep_lib.parent.is_dir()
    deep_lib.write_bytes(b"\x7fELF planted")
    (prefix / "etc/conda/activate.d").mkdir(parents=True, exist_ok=True)
    (prefix / "etc/conda/activate.d/zz.sh").write_text("export LD_PRELOAD=/tmp/x.so\n")
    for name in ("nvcc", "ls"):
        assert not (prefix / "bin" / name).exists()
        (prefix / "bin" / name).write_text("#!/bin/sh\n")
        (prefix / "bin" / name).chmod(0o755)
    # 3. Mode bits: setuid + setgid on the interpreter, 4777 on the extension (on copies: installed
    # files are hard links into the package cache, which other tests' prefixes share).
    (ext,) = (prefix / SITE / "demo_ext").glob("_C*.so")
    for path, mode in ((prefix / "bin/python3.11", 0o6755), (ext, 0o4777)):
        shutil.copy2(path, f"{path}.copy")
        os.replace(f"{path}.copy", path)
        os.chmod(path, mode)
    # 4. An owned file swapped for a link to an identical copy outside the prefix.
    version = prefix / SITE / "torch" / "version.py"
    outside = sandbox.path("outside") / "version.py"
    shutil.copy2(version, outside)
    version.unlink()
    version.symlink_to(outside)

    for args in ([], ["--rehash"], ["--env", "default", "--lock", str(lock), "--rehash"]):
        found = _verify(sandbox, prefix, *args, expect=1)
        files, unowned = found["files"], found["unowned"]
        rel = lambda p: p.relative_to(prefix).as_posix()  # noqa: E731
        assert any(f.startswith(f"modified: {rel(pyc)} (pytorch)") for f in files), files
        assert f"not from any package: {rel(planted_pyc)} (byte code Python runs instead of its source)" in unowned
        assert f"not from any package: {rel(deep_lib)} (a shared library the loader may pick up)" in unowned
        assert "not from any package: etc/conda/activate.d/zz.sh (runs at every activation)" in unowned or \
            "not from any package: etc (a folder)" in unowned
        assert "not from any package: bin/nvcc (on the PATH of every job)" in unowned
        assert "not from any package: bin/ls (on the PATH of every job)" in unowned
        assert any(f.startswith("mode widened: bin/python3.11 is 6755, python gives") for f in files), files
        assert any(f.startswith(f"mode widened: {rel(ext)} is 4777, demo-ext gives") for f in files), files
        assert f"replaced: {rel(version)} is a symbolic link to {outside}, pytorch has a file there" in files


def test_demo_env_forged_conda_meta_is_caught_without_a_lock(sandbox, demo_env):
    lock, prefix = demo_env
    record = conda_meta(prefix, "demo-ext")
    meta = json.loads(record.read_text())
    meta.update(sha256="ab" * 32, url="https://evil.example/linux-64/demo-ext.conda")
    record.write_text(json.dumps(meta))
    for args in ([], ["--rehash"]):
        found = _verify(sandbox, prefix, *args, expect=1)
        assert any(f.startswith("differs: demo-ext") and "sha256 abababababab…" in f for f in found["packages"]), found
    # Without the install record verify cannot vouch, and says which command can.
    receipt_path(prefix).unlink()
    res = sandbox.run("verify", str(prefix), expect=1)
    assert "cannot vouch for" in res.output and "--lock" in res.output, res.output
