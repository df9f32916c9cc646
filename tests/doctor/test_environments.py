"""run_doctor and `extforge doctor` against real Python environments (the target is asked in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from extforge.doctor.diagnosis import run_doctor
from extforge.doctor.extensions import ExtensionSpec

from .conftest import FakeMachine

NO_PROC = Path("/nonexistent/proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def torch_2_14_python(mirror_channel: Path) -> Path:
    """The python of an env holding the mirror's torch 2.14.1+cu130 (its one build, for our
    python), nvidia libs included: an audit target env (hard links into the package cache)."""
    from extforge.audit.channel_target import pinned_torch_prefix

    return pinned_torch_prefix(["pytorch ==2.14.1"], str(mirror_channel)) / "bin" / "python"


def make_env(tmp_path: Path) -> tuple[Path, Path]:
    """A venv without pip (fast) → (its python, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    python = tmp_path / "env" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    return python, Path(purelib)


def install_fake_flash_attn(site: Path, wheel_tag: str, with_extension: bool) -> None:
    """What pip leaves behind: the flash_attn package, its dist-info, maybe the extension module."""
    (site / "flash_attn").mkdir()
    (site / "flash_attn" / "__init__.py").write_text("import flash_attn_2_cuda\n")
    dist = site / "flash_attn-2.8.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\n")
    (dist / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: setuptools (75.1.0)\nRoot-Is-Purelib: false\nTag: {wheel_tag}\n\n")
    (dist / "INSTALLER").write_text("pip\n")
    if with_extension:
        (site / f"flash_attn_2_cuda{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"\x7fELF")


def test_without_torch_it_says_what_it_could_not_check(shadowed_machine: FakeMachine) -> None:
    report = run_doctor(sys.executable, shadowed_machine.env, toolkit_globs=shadowed_machine.globs, proc_driver=NO_PROC)
    f = report.facts
    assert f.python is not None and f.python.executable and f.python.tag == "cp%d%d" % sys.version_info[:2]
    assert f.torch is None
    assert any(n.startswith("torch: not importable") and "No module named 'torch'" in n for n in f.not_checked)
    assert f.driver is not None and f.driver.gpus[0].sm == "sm_90"
    assert f.cores and f.memory_bytes
    # The build plan is for the node's own GPUs (an H100: sm_90), not the recipe's default list.
    assert f.plan is not None and f.plan["archs"] == ["90"]
    # The nvcc older than 11.7 is an error with or without torch.
    assert report.has_errors and any("older than 11.7" in x.title for x in report.findings)


def test_generic_wheel_without_the_extension_is_an_error(tmp_path: Path, shadowed_machine: FakeMachine) -> None:
    python, site = make_env(tmp_path)
    install_fake_flash_attn(site, "py3-none-any", with_extension=False)
    report = run_doctor(str(python), shadowed_machine.env, toolkit_globs=shadowed_machine.globs, proc_driver=NO_PROC)
    (fa,) = report.facts.extensions
    assert (fa.name, fa.version, fa.installer, fa.wheel_tags, fa.extension) == ("flash-attn", "2.8.3", "pip", ("py3-none-any",), None)
    missing = [x for x in report.findings if "no flash_attn_2_cuda" in x.title]
    assert missing and "generic wheel (py3-none-any)" in missing[0].cause
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE" in missing[0].fix


def test_conda_installed_flash_attn_with_its_extension(tmp_path: Path, shadowed_machine: FakeMachine) -> None:
    python, site = make_env(tmp_path)
    tag = "cp%d%d" % sys.version_info[:2]
    install_fake_flash_attn(site, f"{tag}-{tag}-linux_x86_64", with_extension=True)
    meta = tmp_path / "env" / "conda-meta"
    meta.mkdir()
    record = {"name": "flash-attn", "version": "2.8.3", "build": "cuda130_torch211_py312_h1a2b3c4_0", "channel": "file:///srv/channel"}
    (meta / "flash-attn-2.8.3-cuda130_torch211_py312_h1a2b3c4_0.json").write_text(json.dumps(record))
    report = run_doctor(str(python), shadowed_machine.env, toolkit_globs=shadowed_machine.globs, proc_driver=NO_PROC, audit=False)
    (fa,) = report.facts.extensions
    assert fa.installer == "conda" and fa.conda_build == record["build"]
    assert fa.extension and Path(fa.extension).name.startswith("flash_attn_2_cuda")
    assert not [x for x in report.findings if "flash_attn_2_cuda" in x.title]


def test_an_extension_named_only_in_the_data_is_probed_and_diagnosed(tmp_path: Path, shadowed_machine: FakeMachine) -> None:
    """What doctor knows of an installed extension is data (data/doctor-extensions.yaml): a package
    it was never coded for is found by its pip name, its missing module named, its rebuild command
    given, and the oldest nvcc its build takes judged. The old code looked for flash-attn alone, by
    names in its code, and had no way to be told of another package."""
    python, site = make_env(tmp_path)
    (site / "tiny_ext").mkdir()
    (site / "tiny_ext" / "__init__.py").write_text("import tiny_ext_cuda\n")
    dist = site / "tiny_ext-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-ext\nVersion: 0.3\n")
    (dist / "WHEEL").write_text("Wheel-Version: 1.0\nTag: py3-none-any\n")
    (dist / "INSTALLER").write_text("uv\n")
    spec = ExtensionSpec("tiny-ext", ("tiny-ext",), "tiny_ext_cuda", "tiny_ext", "pip install --no-binary tiny-ext tiny-ext=={version}",
                         (12, 0), "tiny-ext needs CUDA 12")
    report = run_doctor(str(python), shadowed_machine.env, toolkit_globs=shadowed_machine.globs, proc_driver=NO_PROC,
                        extensions=[spec])
    (ext,) = report.facts.extensions
    assert (ext.name, ext.module, ext.version, ext.installer) == ("tiny-ext", "tiny_ext_cuda", "0.3", "uv")
    missing = [x for x in report.findings if x.title == "tiny-ext 0.3 has no tiny_ext_cuda extension"]
    assert missing and "`import tiny_ext` raises" in missing[0].cause and missing[0].fix == "pip install --no-binary tiny-ext tiny-ext==0.3"
    # The build's nvcc is 11.5 on this machine: older than what tiny-ext's setup.py takes.
    old = [x for x in report.findings if "older than 12.0" in x.title]
    assert old and "tiny-ext's setup.py stops with \"tiny-ext needs CUDA 12\"" in old[0].cause
    assert not [x for x in report.findings if "flash" in x.title]


def test_real_torch_2_14_on_the_shadowed_machine(shadowed_machine: FakeMachine, torch_2_14_python: Path) -> None:
    report = run_doctor(str(torch_2_14_python), shadowed_machine.env, toolkit_globs=shadowed_machine.globs, proc_driver=NO_PROC)
    t = report.facts.torch
    assert t is not None and t.version.startswith("2.14.1") and t.cuda == "13.0" and t.cxx11_abi is True
    assert "sm_90" in t.arch_list
    titles = [x.title for x in report.findings if x.severity == "error"]
    # nvcc 11.5 is too old; torch has sm_90 kernels for the H100 and driver 580 supports CUDA 13.0.
    assert titles == ["the nvcc builds use is CUDA 11.5, older than 11.7"]


def test_cli_json_and_exit_codes(tmp_path: Path, shadowed_machine: FakeMachine) -> None:
    env = dict(os.environ, **shadowed_machine.env)
    env["PATH"] = f"{shadowed_machine.env['PATH']}{os.pathsep}{Path(sys.executable).parent}"
    cmd = [sys.executable, "-m", "extforge", "doctor", "--json", "--python", sys.executable]
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert {"facts", "findings"} <= doc.keys()
    assert [n["version"] for n in doc["facts"]["nvccs"]][0] == "11.5"

    toolkit = shadowed_machine.root / "usr/local/cuda-12.8"
    env.update(CUDA_HOME=str(toolkit), PATH=f"{toolkit}/bin{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin")
    good = subprocess.run(cmd[:4] + cmd[5:], capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0, good.stderr
    assert "12.8" in good.stderr and "← builds use this" in good.stderr and "not checked" in good.stderr


def test_missing_target_python_cannot_run(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "extforge", "doctor", "--python", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "could not run the target python" in out.stderr
