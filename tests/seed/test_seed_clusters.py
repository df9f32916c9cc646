"""Every cluster our users run, through the unchanged demo-ext recipe: one mirror channel with
each torch build, one channel with each row's package, each row's env locked, installed and
imported; and row C's old C++ ABI proven by a build that gets it wrong."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge.machine import detect

from .conftest import CLUSTERS, SeedBuilds, SeedChannel, install_row_env, make_wrong_abi_package

pytestmark = [pytest.mark.slow, pytest.mark.seed]
ROW_IDS = [c.name for c in CLUSTERS]


def _package_json(conda: Path, member: str) -> dict:
    import tarfile
    import zipfile

    import zstandard

    kind = "info-" if member.startswith("info/") else "pkg-"
    with zipfile.ZipFile(conda) as zf:
        name = next(n for n in zf.namelist() if n.startswith(kind) and n.endswith(".tar.zst"))
        with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(zf.open(name)), mode="r|") as tf:
            for entry in tf:
                if entry.name == member:
                    return json.load(tf.extractfile(entry))
    raise AssertionError(f"no {member} in {conda}")


def _torch_record(channel: Path, version: str, python: str) -> dict:
    data = json.loads((channel / "linux-64" / "repodata.json").read_text())
    return next(r for r in data["packages.conda"].values()
                if r["name"] == "pytorch" and r["version"] == version and f"_py{python.replace('.', '')}_" in r["build"])


def test_one_channel_holds_every_torch_build(seed_channel: SeedChannel):
    for c in CLUSTERS:
        if c.name in seed_channel.rows:
            record = _torch_record(seed_channel.path, c.torch, c.python)
            assert record["build"].startswith(f"cuda{c.cuda.replace('.', '')}_py{c.python.replace('.', '')}_")
    variants = (seed_channel.path / "variants.yaml").read_text()
    assert "zip_keys:" in variants or len(seed_channel.rows) < 2
    assert f'pytorch: [{", ".join(json.dumps(r["pytorch"]) for r in seed_channel.rows.values())}]' in variants


@pytest.mark.parametrize("name", ROW_IDS)
def test_each_row_pins_its_exact_torch_and_names_its_abi(name: str, seed_channel: SeedChannel, seed_builds: SeedBuilds):
    c = next(c for c in CLUSTERS if c.name == name)
    seed_channel.row(c)
    pkg = seed_builds.packages[name]
    index = _package_json(pkg, "info/index.json")
    torch = _torch_record(seed_channel.path, c.torch, c.python)
    assert f"pytorch =={c.torch} {torch['build']}" in index["depends"]
    abi = "cxx11" if c.cxx11_abi else "cxx98"
    assert re.fullmatch(rf"cuda\d+_torch{''.join(c.torch.split('.')[:2])}_py{c.python.replace('.', '')}_{abi}_h[0-9a-f]{{7}}_0",
                        index["build"]), index["build"]
    stamp = _package_json(pkg, "share/extforge/audit/demo-ext.json")
    assert stamp["verdict"] == "pass" and stamp["cxx11_abi"] is c.cxx11_abi, stamp
    assert stamp["torch"].startswith(c.torch)


@pytest.mark.parametrize("name", ROW_IDS)
def test_each_rows_env_locks_to_its_own_build_installs_and_imports(name: str, seed_channel: SeedChannel,
                                                                    seed_builds: SeedBuilds, seed_lock: Path):
    c = next(c for c in CLUSTERS if c.name == name)
    seed_channel.row(c)
    locked = seed_lock.read_text()
    assert seed_builds.packages[name].name in locked
    # The session's background installed it (prepare.py): this install then checks it and
    # finds nothing to do; what the background did not install is installed here.
    proc, prefix = install_row_env(seed_lock, c)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(prefix / "bin" / "python"), "-c",
                          "import torch, demo_ext; print(torch.__version__, demo_ext.rms_norm.__name__)"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"{c.torch}+cu{c.cuda.replace('.', '')}", "rms_norm"]
    # The mirrored pytorch requires numpy as conda-forge's does: without it every import warns.
    assert "numpy" not in out.stderr.lower(), out.stderr


@pytest.fixture(scope="session")
def wrong_abi_package(seed_channel: SeedChannel, fixtures_dir: Path) -> Path:
    """A C++ torch extension built for row C with the new C++ ABI forced on (conftest.py; the
    session's background builds it), which the build's own audit failed."""
    built = make_wrong_abi_package(seed_channel, fixtures_dir)
    if built is None:
        pytest.skip(f"cluster C: {seed_channel.skipped.get('C')}")
    assert built.audit_verdict == "fail", built
    return built.package


def test_a_new_abi_build_against_torch_2_6_is_refused_naming_the_symbol(wrong_abi_package: Path,
                                                                         seed_channel: SeedChannel, tmp_path: Path):
    proc = run_extforge("audit", str(wrong_abi_package), "--channel", str(seed_channel.path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "c10::" in text and "std::__cxx11::basic_string" in text, text
    publish = run_extforge("publish", str(wrong_abi_package), "--channel", str(tmp_path / "published"),
                   "--upstream", str(seed_channel.path))
    assert publish.returncode == 1, publish.stdout + publish.stderr
    assert not list((tmp_path / "published").glob("*/wrong-abi-ext-*"))


def test_explain_says_what_to_do_about_its_import_error(wrong_abi_package: Path, seed_channel: SeedChannel,
                                                        tmp_path: Path):
    import asyncio

    from rattler import BuildString, GenericVirtualPackage, PackageName, Version, install, solve

    from extforge import paths

    channel = tmp_path / "ch"
    (channel / "linux-64").mkdir(parents=True)
    (channel / "linux-64" / wrong_abi_package.name).write_bytes(wrong_abi_package.read_bytes())
    from extforge.mirror.builder import index_channel

    index_channel(channel)
    prefix = tmp_path / "env"

    def vp(name: str, version: str) -> GenericVirtualPackage:
        return GenericVirtualPackage(PackageName(name), Version(version), BuildString("0"))

    async def solve_install() -> None:
        records = await solve([channel.as_uri(), seed_channel.path.resolve().as_uri()], ["wrong-abi-ext"],
                              platforms=["linux-64", "noarch"],
                              virtual_packages=[vp("__unix", "0"), vp("__linux", "5.15"), vp("__glibc", str(detect().glibc)),
                                                vp("__cuda", "12.4")])
        await install(records, target_prefix=prefix, cache_dir=paths.rattler_pkgs_dir(), show_progress=False)

    asyncio.run(solve_install())
    out = subprocess.run([str(prefix / "bin" / "python"), "-c", "import torch, wrong_abi_ext"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "undefined symbol" in out.stderr, out.stderr
    explained = run_extforge("explain", "--json", out.stderr.strip().splitlines()[-1])
    assert explained.returncode == 0, explained.stderr
    primary = json.loads(explained.stdout)["diagnoses"][0]
    assert primary["variant"] == "abi-mismatch", primary
    assert "_GLIBCXX_USE_CXX11_ABI" in primary["fix"], primary

