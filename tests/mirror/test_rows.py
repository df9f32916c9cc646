"""Several torch builds in one mirror channel: rows replace themselves, others stay (pure parts)."""

from extforge.mirror import rows
from extforge.mirror.torch_pkg import parse_cxx11_abi, parse_version_py


def _row(py: str, torch: str, cuda: str, abi: str, files: list[str]) -> rows.Row:
    return rows.Row({"python": py, "pytorch": torch, "cxx_abi": abi, "c_compiler": "gcc", "c_compiler_version": "12",
                     "cuda_compiler": "cuda-nvcc", "cuda_compiler_version": cuda}, files)


def test_adding_a_row_keeps_the_others_and_remirroring_replaces_only_its_own():
    c = _row("3.12", "2.6.0", "12.4", "cxx98", ["linux-64/pytorch-2.6.0-cuda124_py312_ha_0.conda", "linux-64/gcc.conda"])
    d = _row("3.11", "2.14.1", "13.0", "cxx11", ["linux-64/pytorch-2.14.1-cuda130_py311_hb_0.conda", "linux-64/gcc.conda"])
    both = rows.merge(rows.merge([], c), d)
    assert [r.key for r in both] == ["python3.12-pytorch2.6.0-cuda12.4-cxx98", "python3.11-pytorch2.14.1-cuda13.0-cxx11"]
    assert rows.stale_files([c], both) == set()
    # Row C mirrored again from a changed wheel: its old pytorch goes, the shared gcc shim stays.
    c2 = _row("3.12", "2.6.0", "12.4", "cxx98", ["linux-64/pytorch-2.6.0-cuda124_py312_hc_0.conda", "linux-64/gcc.conda"])
    after = rows.merge(both, c2)
    assert [r.key for r in after] == [r.key for r in both]
    assert rows.stale_files(both, after) == {"linux-64/pytorch-2.6.0-cuda124_py312_ha_0.conda"}


def test_variants_yaml_zips_every_row(tmp_path):
    from rattler_build import VariantConfig

    found = rows.merge(rows.merge([], _row("3.12", "2.6.0", "12.4", "cxx98", [])), _row("3.11", "2.14.1", "13.0", "cxx11", []))
    (tmp_path / "v.yaml").write_text(rows.variants_yaml(found))
    config = VariantConfig.from_file(tmp_path / "v.yaml")
    combos = [{k: str(v) for k, v in c.items()} for c in config.combinations()]
    assert len(combos) == 2
    assert {"python": "3.12", "pytorch": "2.6.0", "cxx_abi": "cxx98", "cuda_compiler_version": "12.4"}.items() <= combos[0].items()
    assert combos[1]["cuda_compiler"] == "cuda-nvcc" and combos[1]["pytorch"] == "2.14.1"


def test_torch_abi_is_read_from_its_cmake_config():
    assert parse_cxx11_abi('set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")') is False
    assert parse_cxx11_abi('set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=1")') is True
    assert parse_cxx11_abi("") is True  # torch >= 2.9 dropped the old ABI and the flag with it
    facts = parse_version_py("__version__ = '2.6.0+cu124'\ncuda = '12.4'\n", 'set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")')
    assert (facts.cuda, facts.abi_tag) == ("12.4", "cxx98")
