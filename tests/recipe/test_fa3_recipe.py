"""recipe/flash-attn-3: renders per row and subset, and prepare_sources.py turns upstream's
pinned hopper/ tree into an offline subset build (no compile: that runs on a GPU node)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

from extforge import engine, sources

RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn-3"
BUILD_STRING = re.compile(r"^cuda(\d+)_torch(\d+)_py(\d+)((?:_[a-z0-9-]+)*)_h[0-9a-f]{7}_(\d+)$")
SLIM = {"fa3_head_dims": ["128"], "fa3_dtypes": ["bf16;fp16"], "fa3_features": ["bwd;varlen"]}

_spec = importlib.util.spec_from_file_location("fa3_prepare", RECIPE / "prepare_sources.py")
assert _spec is not None and _spec.loader is not None
prep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prep)


def _render(variant_file: str, overrides: dict[str, list[str]] | None = None) -> list[tuple[dict, dict]]:
    values, zips = engine.read_variant_files([RECIPE / variant_file])
    values |= overrides or {}
    rendered = Stage0Recipe.from_file(RECIPE / "recipe.yaml").render(
        engine.variant_config(values, zips), RenderConfig(platform=PlatformConfig(target_platform="linux-64")))
    return [(v.variant, v.recipe.to_dict()) for v in rendered]


@pytest.mark.parametrize("variant_file", ["variants.yaml", "variants-offline.yaml"])
def test_full_build_per_row_is_the_default(variant_file: str) -> None:
    rendered = _render(variant_file)
    assert len(rendered) == len(VariantConfig.from_file(RECIPE / variant_file).get_values("python"))
    for variant, r in rendered:
        m = BUILD_STRING.match(r["build"]["string"])
        assert m, r["build"]["string"]
        assert m.group(1) == variant["cuda_compiler_version"].replace(".", "")
        assert m.group(2) == "".join(variant["pytorch"].split(".")[:2])
        assert m.group(4) == ""  # no subset words on the full build
        assert r["build"]["variant"]["down_prioritize_variant"] == 0
        run = r["requirements"]["run"]
        # One build for every torch of its CUDA major from 2.9 on (the stable C ABI), not one exact pin.
        assert f"pytorch >=2.9 cuda{variant['cuda_compiler_version'].split('.')[0]}*" in run and not any(isinstance(d, dict) and d.get("pin_compatible", {}).get("name") == "pytorch"
                                                  for d in run)


def test_subset_names_itself_and_is_down_prioritized() -> None:
    (variant, r), *_ = _render("variants-offline.yaml", SLIM)
    assert r["build"]["string"].startswith(f"cuda130_torch{''.join(variant['pytorch'].split('.')[:2])}_py")
    assert "_hd128_bf16_fp16_bwd_varlen_h" in r["build"]["string"]
    assert r["build"]["variant"]["down_prioritize_variant"] == 1
    env = r["build"]["script"]["env"]
    assert (env["FA3_HEAD_DIMS"], env["FA3_DTYPES"], env["FA3_FEATURES"]) == ("128", "bf16;fp16", "bwd;varlen")


def test_sources_are_pinned_archives_only() -> None:
    specs = sources.read_specs(RECIPE)
    assert all(u.startswith("file://") for s in specs for u in s.urls)  # nothing downloads


# ---------------------------------------------------------------- prepare_sources.py (pure)

def test_slim_subset_switches() -> None:
    subset = prep.parse_subset("128", "bf16;fp16", "bwd;varlen")
    off = {s.removeprefix("FLASH_ATTENTION_DISABLE_") for s in prep.disable_switches(subset)}
    assert off == {"HDIM64", "HDIM96", "HDIM192", "HDIM256", "FP8", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL",
                   "SOFTCAP", "PACKGQA", "CLUSTER", "HDIMDIFF64", "HDIMDIFF192", "SM80"}
    assert prep.disable_switches(prep.parse_subset("all", "all", "all")) == []
    # A value-dim pairing is dropped with its head dim, kept with it.
    assert "FLASH_ATTENTION_DISABLE_HDIMDIFF64" not in prep.disable_switches(prep.parse_subset("64", "all", "all"))


@pytest.mark.parametrize(("dims", "dtypes", "features", "words"), [
    ("100", "all", "all", "builds head dims 64, 96"),
    ("all", "fp16", "all", "includes bf16"),
    ("all", "all", "bwd;dropout", "unknown dropout"),
])
def test_bad_subset_values_are_named(dims: str, dtypes: str, features: str, words: str) -> None:
    with pytest.raises(prep.PrepareError, match=words):
        prep.parse_subset(dims, dtypes, features)


def _upstream(tmp_path: Path) -> Path:
    """The recipe's two archives unpacked as rattler-build lays them out (top folder stripped)."""
    found = [sources.stored_path(s) for s in sources.read_specs(RECIPE)]
    shared = Path(__file__).resolve().parents[3] / "shared" / "sources"
    found = [p if p.is_file() else shared / p.name for p in found]
    if not all(p.is_file() for p in found):
        pytest.skip("the FlashAttention-3 archives are neither in the source cache nor in ../shared/sources")
    src = tmp_path / "src"
    for archive, into in zip(found, (src, src / "csrc" / "cutlass"), strict=True):
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if "/" in m.name]
            for m in members:
                m.name = m.name.split("/", 1)[1]
            tf.extractall(into, members=members, filter="data")
    return src


def test_prepare_edits_setup_and_writes_the_switches(tmp_path: Path) -> None:
    src = _upstream(tmp_path)
    env = tmp_path / "env.sh"
    record = tmp_path / "subset.json"
    proc = subprocess.run([sys.executable, str(RECIPE / "prepare_sources.py"), str(src), "--env-out", str(env),
                           "--record-out", str(record)], capture_output=True, text=True,
                          env={"FA3_HEAD_DIMS": "128", "FA3_DTYPES": "bf16;fp16", "FA3_FEATURES": "bwd;varlen",
                               "EXTFORGE_CXX_STD": "c++20", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    setup = (src / "hopper" / "setup.py").read_text()
    assert '"git", "submodule"' not in setup and "if False:  # extforge" in setup
    assert '"-std=c++20"' in setup and '"-std=c++17"' not in setup
    assert "export FLASH_ATTENTION_DISABLE_FP8=TRUE" in env.read_text()
    # Without hdimdiff, a V head dim other than Q/K's is refused, not run on the equal-dims kernel.
    api = (src / "hopper" / "flash_api_stable.cpp").read_text()
    guard = api.index("#ifdef FLASHATTENTION_DISABLE_HDIMDIFF64\n")
    assert api.index('"Only Hopper supports different V headdim"') < guard < api.index("if (head_size_v > 256)")
    assert "STD_TORCH_CHECK(head_size > 64," in api and "STD_TORCH_CHECK(head_size <= 128 || head_size > 192," in api
    # One split is combined (the forward pass's dynamic count of one still returns early).
    combine = (src / "hopper" / "flash_fwd_combine_kernel.h").read_text()
    assert "if (num_splits <= 1) { return; }" not in combine
    assert "if (params.num_splits_dynamic_ptr && num_splits <= 1) { return; }" in combine
    assert (src / "README.md").is_file()
    # A second run on the edited tree is refused: its tree id is no longer upstream's.
    again = subprocess.run([sys.executable, str(RECIPE / "prepare_sources.py"), str(src), "--env-out", str(env)],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "git tree" in again.stderr and "the recipe pins 3e3af0e" in again.stderr


def test_prepare_refuses_an_upstream_change_it_does_not_know() -> None:
    with pytest.raises(prep.PrepareError, match="expected one match"):
        prep.edit_setup('nvcc_flags = ["-O3", "-std=c++20"]\n', "c++20")


def test_subset_build_strings_are_valid_and_the_envs_spec_selects_them() -> None:
    """Build strings hold only [A-Za-z0-9_] (conda splits file names on "-"; rattler's build globs
    take no "."), and the spec envs/gpu-node/pixi.toml writes for the subset matches it."""
    import tomllib

    from rattler import BuildString, MatchSpec, PackageRecord

    (_, slim), *_ = _render("variants-offline.yaml", SLIM)
    (_, multi), *_ = _render("variants-offline.yaml", {"fa3_head_dims": ["64;128"], "fa3_dtypes": ["all"],
                                                       "fa3_features": ["none"]})
    for r in (slim, multi):
        assert re.fullmatch(r"[A-Za-z0-9_]+", r["build"]["string"]), r["build"]["string"]
    assert "_hd64_128_none_h" in multi["build"]["string"]
    manifest = tomllib.loads((RECIPE.parents[1] / "envs" / "gpu-node" / "pixi.toml").read_text())
    wanted = manifest["feature"]["fa3"]["dependencies"]["flash-attn-3"]
    spec = MatchSpec(f"flash-attn-3 {wanted['version']} {wanted['build']}")
    assert spec.matches(PackageRecord(name="flash-attn-3", version="3.0.0", build=BuildString(slim["build"]["string"]),
                                      build_number=0, subdir="linux-64"))


def test_a_subset_that_spells_out_every_choice_is_the_full_build() -> None:
    """`fa3_head_dims=256;64;...` (every head dim, any order) builds the package a plain request
    resolves to: the same build string, no second full build under a subset's name."""
    spelled = {"fa3_head_dims": [";".join(str(d) for d in reversed(prep.HEAD_DIMS))],
               "fa3_dtypes": [";".join(reversed(list(prep.DTYPES)))],
               "fa3_features": [";".join(reversed(list(prep.FEATURES)))]}
    (_, full), *_ = _render("variants-offline.yaml")
    (_, same), *_ = _render("variants-offline.yaml", spelled)
    assert same["build"]["string"] == full["build"]["string"]
    assert same["build"]["variant"]["down_prioritize_variant"] == 0
    # One choice short of the full set stays a subset, named in its build string.
    (_, fewer), *_ = _render("variants-offline.yaml", spelled | {"fa3_head_dims": ["64;96;128;192"]})
    assert "_hd64_96_128_192_" in fewer["build"]["string"]
