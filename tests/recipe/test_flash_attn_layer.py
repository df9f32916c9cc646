"""flash-attn 2.8.3 and FlashAttention-3 built through `extforge build` on the build layer, as
every recipe is: both recipes set EXTFORGE_LAYER=files, so the layer's activation returned at
once (no network refusal, no extforge-nvcc, no build record of the layer) and their build.sh did
part of that by hand. Their kernels take minutes each on this machine (a head-dim-128 build of
flash-attn is 13 of them): each build is watched until its first kernel compiles, what the layer
set up there is read from that compile (its environment, its command, the layer's logs, the
build record the layer writes from them), and the build is stopped. A GPU node builds them whole
(bench/gpu_e2e)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extforge import paths
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.recipes import build_layer, sources

RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn"
FA3 = RECIPE.parent / "flash-attn-3"
LAYER = Path(build_layer.__file__).parents[1] / "data" / "torch-build"


def stand_in_psutil(tmp_path: Path) -> Path:
    """A channel with a `psutil` package: the recipe lists it in host (upstream's setup_requires),
    which the test mirror lacks; setup.py imports it only to choose MAX_JOBS, which the layer sets."""
    folder = tmp_path / "psutil"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(
        "schema_version: 1\npackage: {name: psutil, version: '7.0.0'}\nbuild:\n  noarch: generic\n  script:\n"
        "    - mkdir -p $PREFIX/share && touch $PREFIX/share/psutil-stand-in\n")
    empty = tmp_path / "empty"
    (empty / "noarch").mkdir(parents=True)
    (empty / "noarch" / "repodata.json").write_text('{"info": {"subdir": "noarch"}, "packages": {}}')
    build_recipe(BuildOptions.make(folder, [empty], tmp_path / "psutil-channel", test=False, audit=False))
    return tmp_path / "psutil-channel"


def first_compile(out: Path, proc: subprocess.Popen[str], deadline: float) -> tuple[dict[str, str], list[str]]:
    """The environment and command of the build's first nvcc, once one runs."""
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if Path(argv[0]).name != "nvcc" or "-c" not in argv:
                    continue
                env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
                           .split("\0") if "=" in e)
            except OSError:
                continue
            # This build's: its work folder lies in the cache's builds area (start_build's EXTFORGE_CACHE).
            if env.get("EXTFORGE_REWRITES_LOG", "").startswith(str(out.parent / "cache")):
                return env, argv
        time.sleep(1)
    raise AssertionError(f"no nvcc of the build ran (build exit code {proc.poll()}); log: "
                         f"{next((out / 'logs').glob('*.log'), None)}")


def start_build(recipe: Path, channels: list[str], tmp_path: Path, *variants: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "out"
    # A compile cache of its own, empty: no compile is a cache hit that ends before it is seen.
    env = {**os.environ, "EXTFORGE_CACHE": str(tmp_path / "cache"), "RATTLER_CACHE_DIR": str(paths.rattler_cache_dir())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "extforge", "build", str(recipe), *(a for c in channels for a in ("-c", c)), "-o", str(out),
         "-m", str(recipe / "variants-offline.yaml"), *(a for v in variants for a in ("--variant", v)), "--no-test"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out


def stop(proc: subprocess.Popen[str], out: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    # Its work folders are removed: those in the cache's builds area (start_build's EXTFORGE_CACHE).
    assert "build stopped by SIGTERM" in err and not list((out.parent / "cache").glob("builds*/*"))


def layer_record(compile_env: dict[str, str], tmp_path: Path) -> dict:
    """The record the layer writes into the package at the build's end, from this build's state."""
    prefix = tmp_path / "prefix"
    subprocess.run([compile_env["PYTHON"], str(LAYER / "record.py")], env=compile_env | {"PREFIX": str(prefix)}, check=True)
    return json.loads((prefix / "share" / "extforge" / "build" / f"{compile_env['PKG_NAME']}.json").read_text())


def assert_offline_on_the_layer(compile_env: dict[str, str]) -> None:
    """No network: a namespace without one where the machine allows it, else a proxy to nowhere;
    every Python process refuses it (the layer's sitecustomize), pip has no index; the layer's
    settings (the planner's jobs, the compile cache) were read."""
    assert compile_env["EXTFORGE_NETWORK"] in ("namespace", "proxy") and compile_env["PIP_NO_INDEX"] == "1"
    assert compile_env["PYTHONPATH"].startswith(f"{compile_env['BUILD_PREFIX']}/share/extforge-torch-build/python")
    assert compile_env["EXTFORGE_SETTINGS_FROM"] and compile_env["EXTFORGE_COMPILER_LAUNCHER"]


@pytest.mark.slow
def test_flash_attn_compiles_offline_for_the_variants_arch_through_the_layer(mirror_channel: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    stored, _ = sources.fetch(sources.read_spec(RECIPE))  # PyPI once, then the source cache; sha256 checked
    monkeypatch.setenv("EXTFORGE_SOURCES", str(stored.parents[2]))
    proc, out = start_build(RECIPE, [str(mirror_channel), str(stand_in_psutil(tmp_path))], tmp_path,
                            "flash_attn_head_dims=128", "cuda_archs=9.0")
    try:
        compile_env, argv = first_compile(out, proc, time.monotonic() + 420)
        assert_offline_on_the_layer(compile_env)
        # The variant's arch alone reached nvcc: upstream's own list (FLASH_ATTN_CUDA_ARCHS, default
        # 80;90;100;120) went through extforge-nvcc, which put the variant's in its place.
        assert compile_env["EXTFORGE_ARCH_NAMES"] == "sm_90" and "arch=compute_90,code=sm_90" in argv
        assert not [a for a in argv if a.startswith("arch=") and a != "arch=compute_90,code=sm_90"], argv
        (ninja,) = Path(compile_env["SRC_DIR"]).glob("build/temp.*/build.ninja")
        assert f"nvcc = {compile_env['BUILD_PREFIX']}/bin/extforge-nvcc" in ninja.read_text().splitlines()
        record = layer_record(compile_env, tmp_path)
        assert record["layer"] == "extforge-torch-build" and record["network"] == compile_env["EXTFORGE_NETWORK"]
        assert record["cuda_archs"] == ["sm_90"] and record["torch"].startswith("2.14.1") and record["cxx_std"] == "c++20"
        assert "arch: -gencode arch=compute_80,code=sm_80" in record["upstream_flags_replaced"]
        assert record["max_jobs"] >= 1 and record["nvcc_threads"] >= 1
    finally:
        stop(proc, out)


@pytest.mark.slow
def test_fa3_compiles_its_patched_sources_and_subset_through_the_layer(mirror_channel: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its static fixes are `patches:` now, applied by rattler-build to the pinned archive (not
    regex edits in the build), and its subset is switches a recipe-side script turns the variant
    into, which the layer's record then holds; each unit keeps the arch upstream wrote it for."""
    shared = Path(__file__).resolve().parents[3] / "shared" / "sources"
    for spec in sources.read_specs(FA3):
        if not sources.stored_path(spec).is_file():
            if not (shared / spec.filename).is_file():
                pytest.skip(f"{spec.filename} is neither in the source cache nor in ../shared/sources")
            sources.fetch(spec, sources.default_root(), [shared])
    monkeypatch.setenv("EXTFORGE_SOURCES", str(sources.default_root()))
    proc, out = start_build(FA3, [str(mirror_channel)], tmp_path, "fa3_head_dims=64", "fa3_dtypes=bf16",
                            "fa3_features=none", "cuda_archs=9.0a")
    try:
        compile_env, argv = first_compile(out, proc, time.monotonic() + 420)
        assert_offline_on_the_layer(compile_env)
        assert (compile_env["EXTFORGE_ARCH_FLAGS"], compile_env["EXTFORGE_ARCH_NAMES"]) == ("within", "sm_90a")
        assert [a for a in argv if a.startswith("arch=")] == ["arch=compute_90a,code=sm_90a"], argv
        assert compile_env["FLASH_ATTENTION_DISABLE_SM80"] == compile_env["FLASH_ATTENTION_DISABLE_BACKWARD"] == "TRUE"
        setup = (Path(compile_env["SRC_DIR"]) / "hopper" / "setup.py").read_text()
        assert "if False:  # extforge: the channel's toolkit, never a download" in setup
        record = layer_record(compile_env, tmp_path)
        assert record["subset"]["head_dims"] == [64] and record["stable_abi_floor"] == "2.9"
        assert record["cuda_archs"] == ["sm_90a"] and record["network"] == compile_env["EXTFORGE_NETWORK"]
    finally:
        stop(proc, out)
