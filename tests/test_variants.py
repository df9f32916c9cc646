"""How the variant matrix is resolved from recipe files, mirror channels and --variant flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge.errors import ExtforgeError
from extforge.recipes import build_layer
from extforge.recipes.variants import archs, narrow, recipe_files, resolve

REPO = Path(__file__).resolve().parent.parent
FLASH_ATTN = REPO / "recipe" / "flash-attn" / "recipe.yaml"


def test_narrow_keeps_zip_partners_aligned():
    matrix = {"python": ["3.11", "3.12", "3.13"], "pytorch": ["2.13", "2.14", "2.15"], "arch": ["90"]}
    values = narrow(matrix, [["python", "pytorch"]], {"python": ["3.12", "3.13"], "arch": ["80"]})
    assert values == {"python": ["3.12", "3.13"], "pytorch": ["2.14", "2.15"], "arch": ["80"]}
    with pytest.raises(ExtforgeError, match="not in the variant matrix"):
        narrow({"python": ["3.11", "3.12"], "pytorch": ["2.13", "2.14"]}, [["python", "pytorch"]], {"python": ["3.9"]})
    # Down to one row, a value it lacks replaces it (its zip partners stay).
    assert narrow({"python": ["3.11"], "pytorch": ["2.13"]}, [["python", "pytorch"]], {"python": ["3.9"]}) == {
        "python": ["3.9"], "pytorch": ["2.13"]}


def mirror_channel(tmp_path: Path, python: str, pytorch: str, gcc: str) -> str:
    ch = tmp_path / f"mirror-{python}"
    ch.mkdir()
    (ch / "variants.yaml").write_text(
        f'python: ["{python}"]\npytorch: ["{pytorch}"]\nc_compiler_version: ["{gcc}"]\n'
        f'cxx_compiler_version: ["{gcc}"]\ncuda_compiler: ["cuda-nvcc"]\ncuda_compiler_version: ["13.0"]\n'
    )
    return ch.as_uri()


def test_recipe_variants_are_read_only_when_no_file_is_given(tmp_path):
    # The build layer's variant file comes first for every recipe that lists the layer.
    layer = build_layer.variants_file()
    assert recipe_files(FLASH_ATTN, []) == [layer, FLASH_ATTN.parent / "variants.yaml"]
    offline = FLASH_ATTN.parent / "variants-offline.yaml"
    assert recipe_files(FLASH_ATTN, [offline]) == [layer, offline]
    with pytest.raises(ExtforgeError, match="does not exist"):
        recipe_files(FLASH_ATTN, [tmp_path / "nope.yaml"])
    bare = tmp_path / "bare" / "recipe.yaml"
    bare.parent.mkdir()
    bare.write_text("package: {name: bare, version: '1'}\nrequirements:\n  build:\n    - ninja\n")
    assert recipe_files(bare, []) == []


def test_a_recipe_of_the_layer_inherits_its_archs_and_overrides_them(tmp_path):
    """causal-conv1d, gsplat, mamba-ssm and torch-scatter carried the same variants.yaml
    (cuda_archs 9.0) each: it is the layer's now, and a recipe's own file still wins."""
    channel = mirror_channel(tmp_path, "3.11", "2.14.1", "12")
    causal = REPO / "recipe" / "causal-conv1d" / "recipe.yaml"
    assert not (causal.parent / "variants.yaml").exists()
    assert resolve(causal, [channel], [], {}).values["cuda_archs"] == ["9.0"]
    offline = FLASH_ATTN.parent / "variants-offline.yaml"
    assert resolve(FLASH_ATTN, [channel], [offline], {}).values["cuda_archs"] == ["8.0;9.0"]


def test_the_archs_are_cuda_archs_alone():
    """The old code read archs from any key whose name held "arch" (flash-attn's own
    flash_attn_cuda_archs): a recipe key about something else would have become the build's archs."""
    assert archs({"cuda_archs": ["8.0;9.0", "9.0a"]}) == ["80", "90", "90a"]
    assert archs({"flash_attn_cuda_archs": "80;90", "archive": "x", "arch": "90"}) == []


@pytest.mark.parametrize(
    ("python", "pytorch", "gcc", "archs"),
    [("3.12", "2.11.0", "13", "9.0"), ("3.11", "2.14.1", "12", "8.0;9.0")],
)
def test_a_mirror_channel_selects_its_row_of_the_offline_file(tmp_path, python, pytorch, gcc, archs):
    channel = mirror_channel(tmp_path, python, pytorch, gcc)
    m = resolve(FLASH_ATTN, [channel], [FLASH_ATTN.parent / "variants-offline.yaml"], {})
    assert m.values["python"] == [python] and m.values["pytorch"] == [pytorch]
    assert m.values["c_compiler_version"] == [gcc] and m.values["cuda_archs"] == [archs]
    # The channel fills keys the recipe file leaves open.
    assert m.values["cuda_compiler"] == ["cuda-nvcc"]
    narrowed = resolve(FLASH_ATTN, [channel], [FLASH_ATTN.parent / "variants-offline.yaml"], {"cuda_archs": ["90"]})
    assert narrowed.values["cuda_archs"] == ["9.0"]


def test_a_channel_the_matrix_cannot_use_is_a_clear_error(tmp_path):
    channel = mirror_channel(tmp_path, "3.9", "2.9.0", "12")
    with pytest.raises(ExtforgeError, match="variants-offline.yaml asks for python=3.11,3.12,3.10, which the channel "
                       "cannot build: it has no python 3.11 or 3.12 or 3.10") as err:
        resolve(FLASH_ATTN, [channel], [FLASH_ATTN.parent / "variants-offline.yaml"], {})
    assert "python 3.9, pytorch 2.9.0" in err.value.why
    assert "--from-pip --torch torch==2.9.0 --python /path/to/python3.11" in err.value.fix


def _seed_channel(tmp_path: Path) -> str:
    """A channel variants.yaml as `extforge mirror` writes it after mirroring rows A, B, C and CI's."""
    from extforge.mirror import rows

    found: list = []
    for py, torch, cuda, abi in [("3.10", "2.9.1", "12.4", "cxx11"), ("3.12", "2.9.1", "12.4", "cxx11"),
                                 ("3.12", "2.6.0", "12.4", "cxx98"), ("3.11", "2.14.1", "13.0", "cxx11")]:
        found = rows.merge(found, rows.Row({"python": py, "pytorch": torch, "cxx_abi": abi, "c_compiler": "gcc",
                                            "c_compiler_version": "12", "cxx_compiler": "gxx",
                                            "cxx_compiler_version": "12", "cuda_compiler": "cuda-nvcc",
                                            "cuda_compiler_version": cuda}))
    ch = tmp_path / "seed"
    ch.mkdir()
    (ch / "variants.yaml").write_text(rows.variants_yaml(found))
    return ch.as_uri()


def test_a_channel_of_several_torch_builds_gives_one_row_each(tmp_path):
    channel = _seed_channel(tmp_path)
    m = resolve(REPO / "recipe" / "demo-ext" / "recipe.yaml", [channel], [], {})
    assert m.values["pytorch"] == ["2.9.1", "2.9.1", "2.6.0", "2.14.1"]
    assert m.values["cxx_abi"] == ["cxx11", "cxx11", "cxx98", "cxx11"]
    assert m.values["cuda_archs"] == ["9.0"]  # the recipe's own key stays a product dimension
    (group,) = m.zip_keys
    assert {"python", "pytorch", "cxx_abi", "cuda_compiler_version"} <= set(group)
    # --variant picks rows; zip partners follow.
    only_c = narrow(m.values, m.zip_keys, {"pytorch": ["2.6.0"]})
    assert (only_c["python"], only_c["cxx_abi"]) == (["3.12"], ["cxx98"])


def test_a_recipe_row_meets_only_the_channel_rows_it_names(tmp_path):
    channel = _seed_channel(tmp_path)
    offline = tmp_path / "offline.yaml"
    # Two recipe rows: python 3.12 with torch 2.6.0 (in the channel) and 3.10 with 2.6.0 (not).
    offline.write_text('zip_keys:\n  - [python, pytorch]\npython: ["3.12", "3.10"]\npytorch: ["2.6.0", "2.6.0"]\n'
                       'archs: ["80", "90"]\n')
    m = resolve(REPO / "recipe" / "demo-ext" / "recipe.yaml", [channel], [offline], {})
    assert (m.values["python"], m.values["pytorch"], m.values["cxx_abi"]) == (["3.12"], ["2.6.0"], ["cxx98"])
    assert m.values["archs"] == ["80", "90"]
    offline.write_text('zip_keys:\n  - [python, pytorch]\npython: ["3.10", "3.11"]\npytorch: ["2.6.0", "2.9.1"]\n')
    with pytest.raises(ExtforgeError, match="none of its torch builds has python 3.10, pytorch 2.6.0 together"):
        resolve(REPO / "recipe" / "demo-ext" / "recipe.yaml", [channel], [offline], {})


DEMO_EXT = REPO / "recipe" / "demo-ext" / "recipe.yaml"


@pytest.mark.parametrize("spelling", ["sm_90", "90", "9.0", "sm_90;"])
def test_a_variant_arch_reaches_the_build_in_the_form_its_files_write(tmp_path, spelling):
    """`--variant cuda_archs=sm_90` was passed to the build as written: TORCH_CUDA_ARCH_LIST=sm_90,
    which the build layer refuses inside the build script, 5 s in ("Script failed to execute")."""
    channel = mirror_channel(tmp_path, "3.11", "2.14.1", "12")
    assert resolve(DEMO_EXT, [channel], [], {"cuda_archs": [spelling]}).values["cuda_archs"] == ["9.0"]
    offline = FLASH_ATTN.parent / "variants-offline.yaml"
    assert resolve(FLASH_ATTN, [channel], [offline], {"cuda_archs": ["sm_80 8.0 90"]}).values["cuda_archs"] == ["8.0;9.0"]


def test_a_variant_arch_that_names_no_arch_is_refused_before_the_build(tmp_path):
    channel = tmp_path / "mirror-3.11"
    mirror_channel(tmp_path, "3.11", "2.14.1", "12")
    out = tmp_path / "out"
    proc = run_extforge("build", str(DEMO_EXT.parent), "--channel", str(channel), "--output-dir", str(out),
                        "--variant", "cuda_archs=hopper")
    assert proc.returncode == 2, proc.stderr
    assert "--variant cuda_archs='hopper' is not a list of GPU archs" in proc.stderr
    assert "write 8.0, 80, sm_80" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "bld").exists() and not (out / "logs").exists()
