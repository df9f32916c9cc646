"""A wheel from an audited conda package: the same compiled files, tagged, pinned and relinked for
a pip venv, byte for byte reproducible. Before these, extforge made no wheel at all: a pip user
got nothing from a build (`extforge audit WHEEL` could only judge wheels made elsewhere)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from crafted_ext import (
    DEPENDS,
    MODULE,
    PLAIN,
    SITE,
    THREADS,
    TORCH_PIN,
    extension,
    extension_package,
    stamp,
    torch_env,
    torch_package,
)

from cli_run import run_extforge
from extforge.audit.elf import open_elf
from extforge.errors import ExtforgeError
from extforge.wheel.make import wheel_from_conda
from extforge.wheel.manylinux import Need, platform_tag
from extforge.wheel.requirements import Dep, TorchPin, held_torch, pep440, requires_dist, torch_dep, torch_pin
from security.crafted import craft_package, gxx_so, member

STEM = "demo_x-1.0+cu130torch2.14cxx11abiTRUE"


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_a_wheel_carries_the_packages_files_its_torch_pin_and_venv_search_paths(tmp_path: Path) -> None:
    env = torch_env(tmp_path)
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env))
    wheel = wheel_from_conda(package, tmp_path / "out", env)
    assert wheel.path.name == f"{STEM}-cp311-cp311-manylinux_2_5_x86_64.whl"
    assert (wheel.torch.row, wheel.requires_python) == ("torch2.14.1-cu130", "==3.11.*")
    files = _members(wheel.path)
    assert sorted(files) == sorted([
        "demo_x/__init__.py", f"demo_x/{MODULE}", f"{STEM}.data/data/share/extforge/audit/demo-x.json",
        *(f"{STEM}.dist-info/{n}" for n in ("METADATA", "WHEEL", "top_level.txt", "RECORD"))])
    assert list(files)[-1] == f"{STEM}.dist-info/RECORD"
    metadata = files[f"{STEM}.dist-info/METADATA"].decode()
    # pip's METADATA of the build (summary, description) with the audited package's requirements.
    assert metadata.splitlines()[:7] == ["Metadata-Version: 2.1", "Name: demo-x", "Version: 1.0+cu130torch2.14cxx11abiTRUE",
                                         "Requires-Python: ==3.11.*", "Requires-Dist: torch==2.14.1", "Requires-Dist: einops>=0.6",
                                         "Summary: a crafted extension"]
    assert "extra ==" not in metadata and metadata.endswith("\nThe long description.\n")
    assert files[f"{STEM}.dist-info/WHEEL"].decode().splitlines()[-1] == "Tag: cp311-cp311-manylinux_2_5_x86_64"
    record = list(csv.reader(io.StringIO(files[f"{STEM}.dist-info/RECORD"].decode())))
    assert {row[0] for row in record} == set(files)
    for name, digest, size in record:
        if name.endswith("RECORD"):
            continue
        expected = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(files[name]))
    module = tmp_path / "module.so"
    module.write_bytes(files[f"demo_x/{MODULE}"])
    obj = open_elf(module)
    # Where pip's torch keeps them, the way its own libraries say it (DT_RPATH): not the prefix's lib/.
    assert (obj.rpath, obj.runpath) == (["$ORIGIN/../torch/lib", "$ORIGIN/../nvidia/cu13/lib"], [])
    obj.close()
    assert wheel.sha256 == hashlib.sha256(wheel.path.read_bytes()).hexdigest()


def test_the_label_names_the_pinned_torchs_cuda_not_the_older_nvcc_that_compiled_it(tmp_path: Path) -> None:
    """Row B of the seed clusters: nvcc 12.4 (`cuda-version >=12.4`) against pip's torch
    2.9.1+cu128. The old code labelled it `+cu124torch2.9`, a CUDA no torch of its index row
    (torch2.9.1-cu128) has; upstream's label, and a user matching it to their torch, say cu128."""
    env = torch_env(tmp_path)
    pin = TORCH_PIN.replace("2.14.1", "2.9.1").replace("cuda130", "cuda128")
    depends = [pin if d == TORCH_PIN else "cuda-version >=12.4,<13.0a0" if d.startswith("cuda-version") else d for d in DEPENDS]
    wheel = wheel_from_conda(extension_package(tmp_path / "pkg", extension(tmp_path, env), depends=depends), tmp_path / "out", env)
    assert (wheel.version, wheel.torch.row) == ("1.0+cu128torch2.9cxx11abiTRUE", "torch2.9.1-cu128")


def test_the_same_package_gives_the_same_wheel_bytes(tmp_path: Path) -> None:
    """Times of extraction, scratch paths and file modes of the run do not reach the wheel."""
    env = torch_env(tmp_path)
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env))
    first = wheel_from_conda(package, tmp_path / "a", env)
    second = wheel_from_conda(package, tmp_path / "b", env)
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()


@pytest.mark.parametrize("how", ["debian", "legacy"])
def test_a_debian_pythons_or_a_legacy_install_gives_the_same_wheel(tmp_path: Path, how: str) -> None:
    """debian: on a GPU node the mirrored python is the distribution's, whose pip installs into
    local/lib/python3.X/dist-packages; the old code refused it (no lib/python3.X/site-packages), so
    no node build had a wheel. legacy: Debian 12's pip 23.0 without `wheel` installs with setup.py
    (an .egg-info); the old code copied that .egg-info into the wheel beside its .dist-info, two
    metadata of one project in the venv, and wrote a METADATA without the build's summary."""
    env = torch_env(tmp_path)
    module = extension(tmp_path, env)
    plain = wheel_from_conda(extension_package(tmp_path / "a", module), tmp_path / "wa", env)
    kwargs: dict = {"site": "local/lib/python3.11/dist-packages"} if how == "debian" else {"egg_info": True}
    other = wheel_from_conda(extension_package(tmp_path / "b", module, **kwargs), tmp_path / "wb", env)
    assert not [n for n in _members(other.path) if ".egg-info" in n]
    assert (other.path.name, other.sha256) == (plain.path.name, plain.sha256)


def test_publish_wheels_runs_from_a_source_tree(tmp_path: Path) -> None:
    """As scripts/gpu-e2e runs extforge on a node: its modules from src/ on PYTHONPATH, its
    dependencies from a `pip install --target` tree, no extforge distribution installed. The old
    code read its version for the wheel's Generator line from that distribution's metadata and
    died with PackageNotFoundError."""
    from extforge import __version__
    from extforge.publishing.index import index_channel

    channel = tmp_path / "torch-channel"
    torch_package(channel)
    index_channel(channel)
    env = torch_env(tmp_path)
    depends = [d for d in DEPENDS if not d.startswith("__")]
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env), depends=depends)
    deps = tmp_path / "site"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "extforge" not in entry.name.lower() and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    # The checkout's src/ without the extforge.egg-info an editable install leaves there (git ignores it).
    src = tmp_path / "src"
    src.mkdir()
    (src / "extforge").symlink_to(Path(__file__).resolve().parents[2] / "src" / "extforge")
    proc = subprocess.run([sys.executable, "-S", "-m", "extforge", "publish", str(package), "--wheels", str(tmp_path / "index"),
                           "--upstream", str(channel), "--json"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{deps}"})
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["wheels"]["wheels"]
    with zipfile.ZipFile(tmp_path / "index" / entry["file"]) as zf:
        assert f"Generator: extforge ({__version__})" in zf.read(f"{STEM}.dist-info/WHEEL").decode()


def test_a_torch_op_library_package_publishes_its_wheel(tmp_path: Path) -> None:
    """torch-scatter and torch-cluster ship op libraries (`_scatter_cuda.so`, no Python ABI tag in
    the name: torch.ops.load_library loads them). The old code's audit of the wheel looked for
    them under a `*-packages` folder, which a wheel (whose root is site-packages) has none of, and
    refused the wheel: "ships 1 Python file(s) but no compiled module beside them"."""
    channel = tmp_path / "torch-channel"
    torch_package(channel)
    from extforge.publishing.index import index_channel

    index_channel(channel)
    env = torch_env(tmp_path)
    depends = [d for d in DEPENDS if not d.startswith("__")]
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env, PLAIN, "_x_cuda.so"), depends=depends,
                                module_name="_x_cuda.so")
    proc = run_extforge("publish", str(package), "--wheels", str(tmp_path / "index"), "--upstream", str(channel), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(proc.stdout)["wheels"]["wheels"]
    assert entry["file"].endswith(f"/{STEM}-cp311-cp311-manylinux_2_5_x86_64.whl"), entry
    assert "demo_x/_x_cuda.so" in _members(tmp_path / "index" / entry["file"])


def _auditwheel_verdict(wheel: Path) -> dict:
    """auditwheel's own reading of the wheel, its external libraries left unresolved (no ld paths)."""
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", "--ldpaths", "", str(wheel)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("source, tag", [
    ('extern "C" int f(int x) { return x + 1; }\n', "manylinux_2_5_x86_64"),
    (THREADS, "manylinux_2_34_x86_64"),
    ('#include <string>\nstd::string g(std::string a) { return a + "x"; }\n', "manylinux_2_24_x86_64"),
])
def test_the_platform_tag_is_auditwheels_verdict(tmp_path: Path, source: str, tag: str) -> None:
    env = torch_env(tmp_path)
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env, source))
    wheel = wheel_from_conda(package, tmp_path / "out", env)
    assert wheel.tag.endswith(tag)
    assert _auditwheel_verdict(wheel.path)["sym_tag"] == tag


def test_a_binary_newer_than_the_sites_target_is_refused_naming_the_symbol(tmp_path: Path) -> None:
    """`--manylinux 2_28`: a module calling pthread_create@GLIBC_2.34 would not load on a 2.28 node."""
    env = torch_env(tmp_path)
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env, THREADS))
    with pytest.raises(ExtforgeError) as err:
        wheel_from_conda(package, tmp_path / "out", env, manylinux=(2, 28))
    assert err.value.exit_code == 1
    assert "manylinux_2_34, newer than the site's target manylinux_2_28" in err.value.what
    assert f"demo_x/{MODULE} needs pthread_create@GLIBC_2.34 (from libc.so.6)" in err.value.what
    assert "older compiler and sysroot" in err.value.fix
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    assert wheel_from_conda(package, tmp_path / "out", env, manylinux=(2, 34)).tag.endswith("manylinux_2_34_x86_64")


def test_a_binary_no_policy_allows_is_refused() -> None:
    needs = [Need("m.so", "libstdc++.so.6", "GLIBCXX_3.4.99", "_ZNSt4from_the_future"), Need("m.so", "libc.so.6", "GLIBC_2.17")]
    with pytest.raises(ExtforgeError) as err:
        platform_tag(needs, "x86_64")
    assert err.value.what.startswith("no manylinux policy allows these binaries: m.so needs "
                                     "_ZNSt4from_the_future@GLIBCXX_3.4.99 (from libstdc++.so.6), newer than manylinux_2_")


def test_a_limited_api_module_gets_the_abi3_tag(tmp_path: Path) -> None:
    env = torch_env(tmp_path)
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env, name="_C.abi3.so"), module_name="_C.abi3.so")
    wheel = wheel_from_conda(package, tmp_path / "out", env)
    assert (wheel.tag, wheel.requires_python) == ("cp311-abi3-manylinux_2_5_x86_64", ">=3.11")


def test_a_stable_abi_package_gives_a_wheel_for_its_range(tmp_path: Path) -> None:
    """flash-attn-3 requires `pytorch >=2.9 cuda13*` (torch's stable C ABI, an .abi3.so): its wheel
    requires `torch>=2.9`, is labelled with its toolkit alone and served from the row of the torch
    it was made against; the audit holds that label to a venv's CUDA. The old code refused every
    range (`pins no exact torch`), so FA3 had no wheel, and read no label without a torch part."""
    from extforge.audit import audit_target

    env = torch_env(tmp_path)
    depends = [d for d in ["pytorch >=2.9 cuda13*", *DEPENDS[2:]] if not d.startswith("__")]
    package = extension_package(tmp_path / "pkg", extension(tmp_path, env, name="_C.abi3.so"), module_name="_C.abi3.so",
                                depends=depends)
    wheel = wheel_from_conda(package, tmp_path / "out", env)
    # No torch in the label; the C++ ABI the audit stamp proved stays.
    assert (wheel.version, wheel.torch.row) == ("1.0+cu130cxx11abiTRUE", "torch2.14.1-cu130")
    assert wheel.path.name == "demo_x-1.0+cu130cxx11abiTRUE-cp311-abi3-manylinux_2_5_x86_64.whl"
    assert "Requires-Dist: torch>=2.9\n" in _members(wheel.path)[f"demo_x-{wheel.version}.dist-info/METADATA"].decode()
    assert audit_target(wheel.path, against=env).ok
    other = audit_target(wheel.path, against=torch_env(tmp_path / "cu128", "2.14.1+cu128"))
    assert [f.message for f in other.errors] == [
        "demo_x 1.0+cu130cxx11abiTRUE is built with CUDA 13.0 (label cu130); the environment's torch uses CUDA 12.8"]


@pytest.mark.parametrize("case, expected", [
    ("failed audit", "its audit verdict is 'fail'"),
    ("no stamp", "it carries no audit stamp"),
    ("torch range", "pins no exact torch (pytorch >=2.6)"),
    ("conda-only library", "needs libfoo.so, which neither the wheel"),
    ("library outside site-packages", "it ships the binary lib/libextra.so outside site-packages"),
    ("build prefix in a text file", "names the build prefix"),
])
def test_what_cannot_become_a_wheel_is_refused(tmp_path: Path, case: str, expected: str) -> None:
    env = torch_env(tmp_path)
    libs = ()
    if case == "conda-only library":
        libs = (f"-L{gxx_so(tmp_path / 'other', 'libfoo.so').parent}", "-l:libfoo.so")
    module = extension(tmp_path, env, "extern \"C\" int f() { return 0; }\n", "_C.cpython-311-x86_64-linux-gnu.so", *libs)
    kwargs: dict = {
        "failed audit": {"audit": stamp("fail")},
        "no stamp": {"audit": b"{not json"},
        "torch range": {"depends": ["pytorch >=2.6", *DEPENDS[2:]]},
        "library outside site-packages": {"extra": [member("lib/libextra.so", (tmp_path / "ext" / MODULE).read_bytes())]},
    }.get(case, {})
    package = extension_package(tmp_path / "pkg", module, **kwargs)
    if case == "build prefix in a text file":
        from security.crafted import craft_package, paths_entries

        members = [member(f"{SITE}/demo_x/{MODULE}", module, 0o755), member(f"{SITE}/demo_x/config.py", b"P = '/build/_h_env'\n"),
                   member("share/extforge/audit/demo-x.json", stamp())]
        paths = paths_entries(members)
        paths[1].update(prefix_placeholder="/build/_h_env", file_mode="text")
        package = craft_package(tmp_path / "pkg2", "demo-x", members, version="1.0", build="cuda130_h1_0", subdir="linux-64",
                                index={"depends": DEPENDS}, paths=paths)
    with pytest.raises(ExtforgeError) as err:
        wheel_from_conda(package, tmp_path / "out", env)
    assert expected in err.value.what
    assert err.value.exit_code == 1


def test_conda_requirements_become_pypi_requirements() -> None:
    pin = torch_pin(DEPENDS, "x")
    assert (pin, pin.row) == (TorchPin("2.14.1", "130"), "torch2.14.1-cu130")
    assert torch_pin(["pytorch ==2.9.1 cpu_py312_h1_0"], "x").row == "torch2.9.1-cpu"
    assert torch_pin([TORCH_PIN.replace("2.14.1", "2.9.1").replace("cuda130", "cuda128")], "x").row == "torch2.9.1-cu128"
    assert requires_dist([*DEPENDS, "numpy >=1.21,<3", "triton 3.8.*", "packaging", "libstdcxx >=12", "cuda-cudart"],
                         torch_dep(DEPENDS, "x"), "x", pin.row, {}) == [
        "torch==2.14.1", "einops>=0.6", "numpy>=1.21,<3", "triton==3.8.*", "packaging"]
    assert [pep440(Dep.parse(d)) for d in ("x =1.2", "x 1.2.3", "x >=1.0a0,!=1.1", "x *")] == ["==1.2.*", "==1.2.3", ">=1.0a0,!=1.1", ""]
    with pytest.raises(ExtforgeError, match="has no PyPI equivalent"):
        pep440(Dep.parse("x 1.2|1.4"))
    with pytest.raises(ExtforgeError, match="pins no exact torch"):
        torch_dep(["pytorch", "python"], "x")
    assert held_torch("2.11.0 cuda130_py312_h1_0") == held_torch("2.11.0+cu130") == TorchPin("2.11.0", "130")
    assert held_torch(None) is None


def test_build_writes_each_passing_packages_wheel_and_a_refused_one_is_a_finding(tmp_path: Path) -> None:
    """`extforge build --wheel --manylinux 2_28`: a package that passes its audit gets its wheel in
    OUTPUT/wheels beside the channel; one whose module needs GLIBC_2.34 gets none, the build says
    why and exits 1 (a CI job reading only the exit code must not publish a half)."""
    from extforge.building.build import BuiltPackage, after_build
    from extforge.commands.build import build_exit_code, built_line
    from extforge.publishing.index import index_channel

    channel = tmp_path / "torch-channel"
    torch_package(channel)
    index_channel(channel)
    env = torch_env(tmp_path)
    out = tmp_path / "out"
    # No __glibc floor in its requirements: the audit would rightly fail a module needing more.
    depends = [d for d in DEPENDS if not d.startswith("__")]
    built = [BuiltPackage(extension_package(out / "linux-64", extension(tmp_path / v, env, source), version=v, depends=depends),
                          "demo-x", v,
                          "cuda130_torch214_py311_cxx11_h1234567_0", "linux-64") for v, source in (("1.0", PLAIN), ("1.1", THREADS))]
    after_build(built, [str(channel)], wheel=True, manylinux=(2, 28))
    assert [p.audit_verdict for p in built] == ["pass", "pass"]
    assert built[0].wheel is not None and built[0].wheel.parent == out / "wheels" and built[0].wheel.is_file()
    assert built[0].wheel.name.startswith("demo_x-1.0+cu130torch2.14") and built[0].wheel_refused is None
    assert built[1].wheel is None and "pthread_create@GLIBC_2.34" in str(built[1].wheel_refused)
    assert "no wheel: the wheel needs manylinux_2_34" in built_line(built[1])
    assert build_exit_code(built) == 1 and build_exit_code(built[:1]) == 0


def test_build_pins_a_package_built_per_torch_to_the_one_in_its_channels(tmp_path: Path) -> None:
    """`extforge build --wheel recipe/mamba-ssm -c out`: its requirement on causal-conv1d (built by
    extforge per torch) could only be pinned to a wheel an index serves, so the old build refused
    the wheel ("the wheel index row ... serves no wheel of it"). Now it is the version the channel
    holds built for the same torch (1.7.0; the 1.6.0 built for another torch is not taken)."""
    from extforge.building.build import BuiltPackage, after_build
    from extforge.publishing.index import index_channel

    channel = tmp_path / "torch-channel"
    torch_package(channel)
    for version, pin in (("1.7.0", TORCH_PIN), ("1.6.0", "pytorch ==2.13.0 cuda130_py311_h0000000_0")):
        craft_package(channel / "linux-64", "causal-conv1d", [member("x", b"")], version=version, build="cuda130_0",
                      subdir="linux-64", index={"depends": [pin]})
    index_channel(channel)
    env = torch_env(tmp_path)
    out = tmp_path / "out"
    depends = [d for d in DEPENDS if not d.startswith("__")] + ["causal-conv1d >=1.2.0"]
    built = [BuiltPackage(extension_package(out / "linux-64", extension(tmp_path, env), depends=depends), "demo-x", "1.0",
                          "cuda130_torch214_py311_cxx11_h1234567_0", "linux-64")]
    after_build(built, [str(channel)], wheel=True)
    assert built[0].wheel_refused is None and built[0].wheel is not None, built[0].wheel_refused
    (metadata,) = [v.decode() for k, v in _members(built[0].wheel).items() if k.endswith(".dist-info/METADATA")]
    assert "Requires-Dist: causal-conv1d==1.7.0" in metadata.splitlines()
