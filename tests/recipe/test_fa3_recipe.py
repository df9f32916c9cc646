"""recipe/flash-attn-3: renders per row and subset, its patches apply to upstream's pinned
hopper/ tree (the archives' git trees checked), and subset.py turns the variant into upstream's
switches (no compile: that runs on a GPU node)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

from extforge import engine
from extforge.recipes import sources

RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn-3"
BUILD_STRING = re.compile(r"^cuda(\d+)_torch(\d+)_py(\d+)((?:_[a-z0-9-]+)*)_h[0-9a-f]{7}_(\d+)$")
SLIM = {"fa3_head_dims": ["128"], "fa3_dtypes": ["bf16;fp16"], "fa3_features": ["bwd;varlen"], "cuda_archs": ["9.0a"]}

_spec = importlib.util.spec_from_file_location("fa3_subset", RECIPE / "subset.py")
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
    # On the layer: the variant's archs, each unit keeping the one upstream wrote it for.
    assert (env["TORCH_CUDA_ARCH_LIST"], env["EXTFORGE_ARCH_FLAGS"]) == ("9.0a", "within")
    assert "EXTFORGE_LAYER" not in env and "extforge-torch-build" in r["requirements"]["build"]


def test_sources_are_pinned_archives_only() -> None:
    specs = sources.read_specs(RECIPE)
    assert all(u.startswith("file://") for s in specs for u in s.urls)  # nothing downloads


# ---------------------------------------------------------------- subset.py (pure)

def test_slim_subset_switches() -> None:
    subset = prep.parse_subset("128", "bf16;fp16", "bwd;varlen")
    off = {s.removeprefix("FLASH_ATTENTION_DISABLE_") for s in prep.disable_switches(subset, sm80=False)}
    assert off == {"HDIM64", "HDIM96", "HDIM192", "HDIM256", "FP8", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL",
                   "SOFTCAP", "PACKGQA", "CLUSTER", "HDIMDIFF64", "HDIMDIFF192", "SM80"}
    assert prep.disable_switches(prep.parse_subset("all", "all", "all"), sm80=True) == []
    # A value-dim pairing is dropped with its head dim, kept with it.
    assert "FLASH_ATTENTION_DISABLE_HDIMDIFF64" not in prep.disable_switches(prep.parse_subset("64", "all", "all"), True)


@pytest.mark.parametrize(("dims", "dtypes", "features", "words"), [
    ("100", "all", "all", "builds head dims 64, 96"),
    ("all", "fp16", "all", "includes bf16"),
    ("all", "all", "bwd;dropout", "unknown dropout"),
    ("all", "all", "bwd;sm80", "name 8.0 beside 9.0a in cuda_archs"),
])
def test_bad_subset_values_are_named(dims: str, dtypes: str, features: str, words: str) -> None:
    with pytest.raises(prep.SubsetError, match=words):
        prep.parse_subset(dims, dtypes, features)


@pytest.mark.parametrize(("names", "sm80"), [("sm_90a", False), ("sm_80,sm_90a", True), ("sm_90", None), ("", None)])
def test_the_variants_archs_decide_the_a100_code_path(names: str, sm80: bool | None) -> None:
    """FA3's A100 code path was a feature (fa3_features sm80) beside no arch key at all; it is 8.0
    in cuda_archs now, the one key the layer reads the archs from."""
    if sm80 is None:
        with pytest.raises(prep.SubsetError, match="written for sm_90a"):
            prep.check_archs(names)
    else:
        assert prep.check_archs(names) is sm80


def test_the_subset_becomes_switches_and_a_build_record_entry(tmp_path: Path) -> None:
    record = tmp_path / "record-extra.json"
    proc = subprocess.run([sys.executable, str(RECIPE / "subset.py")], capture_output=True, text=True,
                          env={"FA3_HEAD_DIMS": "128", "FA3_DTYPES": "bf16;fp16", "FA3_FEATURES": "bwd;varlen",
                               "EXTFORGE_ARCH_NAMES": "sm_90a", "EXTFORGE_RECORD_EXTRA": str(record), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "export FLASH_ATTENTION_DISABLE_FP8=TRUE\n" in proc.stdout and "DISABLE_SM80=TRUE" in proc.stdout
    extra = json.loads(record.read_text())
    assert extra["subset"]["head_dims"] == [128] and "FLASH_ATTENTION_DISABLE_SM80" in extra["subset"]["disabled"]
    bad = subprocess.run([sys.executable, str(RECIPE / "subset.py")], capture_output=True, text=True,
                         env={"EXTFORGE_ARCH_NAMES": "sm_90", "EXTFORGE_RECORD_EXTRA": str(record)})
    assert bad.returncode == 1 and bad.stderr.startswith("error: the variant's archs are sm_90") and not bad.stdout


# ---------------------------------------------------------------- the pinned sources and their patches

# Pinned upstream trees: `git rev-parse <commit>:<folder>` of the commits the recipe names.
TREE_IDS = {"flash-attention-0251105a-hopper.tar.gz": ("hopper", "3e3af0e612ac050cf70f8fa1c73f8b97877ec2a6"),
            "cutlass-7127592-include.tar.gz": ("include", "3c43ce5aa9a960e8ea26cdf485a121048d09d3ee")}


def git_tree_id(folder: Path) -> str:
    """The id `git write-tree` gives this folder (files, executables, symlinks; no empty dirs)."""
    entries = []
    for child in folder.iterdir():
        st = child.lstat()
        if stat.S_ISLNK(st.st_mode):
            mode, oid = b"120000", _blob_id(os.readlink(child).encode())
        elif stat.S_ISDIR(st.st_mode):
            if not any(child.iterdir()):
                continue
            mode, oid = b"40000", git_tree_id(child)
        else:
            mode = b"100755" if st.st_mode & stat.S_IXUSR else b"100644"
            oid = _blob_id(child.read_bytes())
        # git sorts trees as if their name ended in "/".
        key = child.name.encode() + (b"/" if mode == b"40000" else b"")
        entries.append((key, mode + b" " + child.name.encode() + b"\0" + bytes.fromhex(oid)))
    body = b"".join(e for _, e in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _archive(name: str) -> Path:
    """One of the recipe's archives, from the source cache or ../shared/sources of the project."""
    (spec,) = [s for s in sources.read_specs(RECIPE) if s.filename == name]
    found = [p for p in (sources.stored_path(spec), Path(__file__).resolve().parents[3] / "shared" / "sources" / name)
             if p.is_file()]
    if not found:
        pytest.skip(f"{name} is neither in the source cache nor in ../shared/sources")
    return found[0]


def _unpack(archive: Path, into: Path) -> Path:
    """The archive as rattler-build lays it out (its one top folder stripped)."""
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if "/" in m.name]
        for m in members:
            m.name = m.name.split("/", 1)[1]
        tf.extractall(into, members=members, filter="data")
    return into


def test_the_archives_are_upstreams_trees_and_the_patches_apply(tmp_path: Path) -> None:
    """prepare_sources.py checked the unpacked trees' git ids and edited upstream's files with
    regexes in every build; the edits are `patches:` now, and the tree ids (the archives' sha256
    pin their bytes) are proved here."""
    for name, (folder, tree) in TREE_IDS.items():
        assert git_tree_id(_unpack(_archive(name), tmp_path / name) / folder) == tree, name
    src = tmp_path / "flash-attention-0251105a-hopper.tar.gz"
    (first, *_), *_ = [[s for s in r["source"]] for _, r in _render("variants-offline.yaml")]
    patches = [RECIPE / p for p in first["patches"]]
    assert patches and all(p.is_file() for p in patches)
    for patch in patches:
        dry = subprocess.run(["patch", "-p1", "--dry-run", "-d", str(src), "-i", str(patch)], capture_output=True, text=True)
        assert dry.returncode == 0 and "FAILED" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout
        subprocess.run(["patch", "-p1", "-d", str(src), "-i", str(patch)], check=True, capture_output=True)
    setup = (src / "hopper" / "setup.py").read_text()
    assert '"git", "submodule"' not in setup and "if False:  # extforge" in setup and "../README.md\", \"r\"" not in setup
    # Without hdimdiff, a V head dim other than Q/K's is refused, not run on the equal-dims kernel.
    api = (src / "hopper" / "flash_api_stable.cpp").read_text()
    guard = api.index("#ifdef FLASHATTENTION_DISABLE_HDIMDIFF64\n")
    assert api.index('"Only Hopper supports different V headdim"') < guard < api.index("if (head_size_v > 256)")
    assert "STD_TORCH_CHECK(head_size > 64," in api and "STD_TORCH_CHECK(head_size <= 128 || head_size > 192," in api
    # One split is combined (the forward pass's dynamic count of one still returns early).
    combine = (src / "hopper" / "flash_fwd_combine_kernel.h").read_text()
    assert "if (num_splits <= 1) { return; }" not in combine
    assert "if (params.num_splits_dynamic_ptr && num_splits <= 1) { return; }" in combine
    # The recipe keeps no edit of its own in the build: the layer raises -std itself.
    assert not list(RECIPE.glob("prepare_sources.py")) and "-std" not in (RECIPE / "build.sh").read_text()


def test_subset_build_strings_are_valid_and_the_envs_spec_selects_them() -> None:
    """Build strings hold only [A-Za-z0-9_] (conda splits file names on "-"; rattler's build globs
    take no "."), and the spec envs/gpu-node/pixi.toml writes for the subset matches it."""
    import tomllib

    from rattler import BuildString, MatchSpec, PackageRecord

    (_, slim), *_ = _render("variants-offline.yaml", SLIM)
    (_, multi), *_ = _render("variants-offline.yaml", {"fa3_head_dims": ["64;128"], "fa3_dtypes": ["all"],
                                                       "fa3_features": ["none"], "cuda_archs": ["9.0a"]})
    for r in (slim, multi):
        assert re.fullmatch(r"[A-Za-z0-9_]+", r["build"]["string"]), r["build"]["string"]
    assert "_hd64_128_none_h" in multi["build"]["string"]
    manifest = tomllib.loads((RECIPE.parents[1] / "envs" / "gpu-node" / "pixi.toml").read_text())
    wanted = manifest["feature"]["fa3"]["dependencies"]["flash-attn-3"]
    spec = MatchSpec(f"flash-attn-3 {wanted['version']} {wanted['build']}")
    assert spec.matches(PackageRecord(name="flash-attn-3", version="3.0.0", build=BuildString(slim["build"]["string"]),
                                      build_number=0, subdir="linux-64"))


def test_the_a100_code_path_is_named_where_it_sets_a_build_apart() -> None:
    with_sm80 = _render("variants-offline.yaml", SLIM | {"cuda_archs": ["8.0;9.0a"]})[0][1]["build"]["string"]
    assert "_hd128_bf16_fp16_bwd_varlen_sm80_h" in with_sm80
    (_, hopper_only), *_ = _render("variants-offline.yaml", {"cuda_archs": ["9.0a"]})
    assert "_py311_sm90a_h" in hopper_only["build"]["string"] and hopper_only["build"]["variant"]["down_prioritize_variant"] == 1


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
