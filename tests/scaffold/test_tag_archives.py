"""`extforge recipe new` on an sdist that lacks the sources its setup.py compiles (fast-hadamard-
transform 1.1.0's holds setup.py, the package and tests/, not csrc/: upstream has no MANIFEST.in),
and on upstream's archive of the release's tag, which has every source and no PKG-INFO."""

from __future__ import annotations

import json
from pathlib import Path

from ruamel.yaml import YAML
from tests.scaffold.test_pyg_sdists import channel

from extforge.cli import main
from extforge.hashing import sha256_file
from sdists import tar_gz

# fast-hadamard-transform 1.1.0's setup.py, its lines that recipe new reads.
SETUP_PY = '''\
import os
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

PACKAGE_NAME = "fast_hadamard_transform"
FORCE_BUILD = os.getenv("FAST_HADAMARD_TRANSFORM_FORCE_BUILD", "FALSE") == "TRUE"
SKIP_CUDA_BUILD = os.getenv("FAST_HADAMARD_TRANSFORM_SKIP_CUDA_BUILD", "FALSE") == "TRUE"
FORCE_CXX11_ABI = os.getenv("FAST_HADAMARD_TRANSFORM_FORCE_CXX11_ABI", "FALSE") == "TRUE"
ext_modules = []
if not SKIP_CUDA_BUILD:
    ext_modules.append(
        CUDAExtension(
            name="fast_hadamard_transform_cuda",
            sources=["csrc/fast_hadamard_transform.cpp", "csrc/fast_hadamard_transform_cuda.cu"],
        )
    )


def get_package_version():
    return "1.1.0"


setup(
    name=PACKAGE_NAME,
    version=get_package_version(),
    packages=find_packages(exclude=("build", "csrc", "include", "tests", "dist", "docs", "benchmarks")),
    description="Fast Hadamard Transform in CUDA, with a PyTorch interface",
    url="https://github.com/Dao-AILab/fast-hadamard-transform",
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    install_requires=["torch", "packaging", "ninja"],
)
'''
PKG_INFO = """\
Metadata-Version: 2.4
Name: fast_hadamard_transform
Version: 1.1.0
Summary: Fast Hadamard Transform in CUDA, with a PyTorch interface
Home-page: https://github.com/Dao-AILab/fast-hadamard-transform
Classifier: License :: OSI Approved :: BSD License
Requires-Dist: torch
Requires-Dist: packaging
Requires-Dist: ninja
"""
# Its test file's imports.
TEST_FILE = """\
import math

import torch
import pytest

from einops import rearrange, repeat

from fast_hadamard_transform.fast_hadamard_transform_interface import hadamard_transform, hadamard_transform_ref
"""
TREE = {"setup.py": SETUP_PY, "LICENSE": "BSD 3-Clause License\n\nCopyright (c) 2022, the respective contributors\n", "fast_hadamard_transform/__init__.py": '__version__ = "1.1.0"\n',
        "tests/test_fast_hadamard_transform.py": TEST_FILE, "csrc/fast_hadamard_transform.cpp": "",
        "csrc/fast_hadamard_transform_cuda.cu": ""}
TAG_ARCHIVE = "https://github.com/Dao-AILab/fast-hadamard-transform/archive/refs/tags/v1.1.0.tar.gz"


def test_an_sdist_without_the_sources_setup_py_compiles_names_them_and_the_tag_archive(tmp_path: Path, capsys) -> None:
    """The old recipe new wrote a recipe from PyPI's sdist and exit 1 for an unknown download
    switch only; its build failed after the compile started (ninja: 'csrc/...cpp', missing and
    no known rule to make it, in the log; on the console rattler-build's "Script failed to
    execute"). Now the missing sources are named, with the command that reads the tag's archive,
    the download switch is decided (download-switches.yaml), and the license read from LICENSE
    (the old one left about.license out: PKG-INFO names only the BSD family)."""
    sdist_files = {k: v for k, v in TREE.items() if not k.startswith("csrc/")} | {"PKG-INFO": PKG_INFO}
    sdist = tar_gz(tmp_path / "fast_hadamard_transform-1.1.0.tar.gz", "fast_hadamard_transform-1.1.0", sdist_files)
    code = main(["recipe", "new", "fast-hadamard-transform==1.1.0", "--sdist", str(sdist), "--dest", str(tmp_path / "r"),
                 "--url", "https://example.invalid/fast_hadamard_transform-1.1.0.tar.gz", "--json"])
    out = json.loads(capsys.readouterr().out)
    # PKG-INFO's classifier names a family (BSD License); LICENSE's first line names the license.
    assert code == 1 and "no short license" not in json.dumps(out)
    assert out["undecided"][:1] == [
        "the sdist lacks 2 of the sources setup.py compiles (csrc/fast_hadamard_transform.cpp, "
        "csrc/fast_hadamard_transform_cuda.cu): unless setup.py generates them, a build from it fails; write the recipe from upstream's archive of the "
        f"release's tag: extforge recipe new fast-hadamard-transform==1.1.0 --force --sdist ARCHIVE --url {TAG_ARCHIVE}"]
    assert out["decided"][0]["set"] == {"FAST_HADAMARD_TRANSFORM_FORCE_BUILD": "TRUE",
                                        "FAST_HADAMARD_TRANSFORM_SKIP_CUDA_BUILD": "FALSE"}


def test_the_tags_archive_makes_a_recipe_whose_source_the_cache_holds(tmp_path: Path, capsys) -> None:
    """GitHub's archive of tag v1.1.0 has no PKG-INFO: the old recipe new refused it ("pass the
    project's sdist, not a git archive"), and with --url its recipe named the source cache's file
    by the --sdist file's name, where `sources fetch` stores it by the URL's (v1.1.0.tar.gz): the
    build refused the recipe. Now the release comes from setup.py and the package's __version__,
    and the recipe's first URL is the file `sources fetch` stores. The old one named no requirement
    of upstream's tests beyond a test extra (this package has none; its tests import einops)."""
    tree = tar_gz(tmp_path / "download" / "fast-hadamard-transform-1.1.0.tar.gz", "fast-hadamard-transform-1.1.0", TREE)
    demo = channel(tmp_path / "channel", ["python", "pytorch", "packaging"])
    code = main(["recipe", "new", "fast-hadamard-transform==1.1.0", "--sdist", str(tree), "--url", TAG_ARCHIVE,
                 "--dest", str(tmp_path / "recipes"), "-c", str(demo), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["undecided"] == []
    # What upstream's test file imports and declares nowhere (the old recipe new named only a test extra's).
    assert out["upstream_tests"]["imports"] == ["pytest", "einops"]
    assert out["mirror_command"] == f"extforge mirror --channel {demo} --extra pytest --extra einops"
    assert out["imports"] == ["fast_hadamard_transform", "fast_hadamard_transform_cuda"] and out["run"] == ["packaging"]
    folder, sha = tmp_path / "recipes" / "fast-hadamard-transform", sha256_file(tree)
    recipe = YAML(typ="safe").load((folder / "recipe.yaml").read_text())
    assert recipe["about"] == {"homepage": "https://github.com/Dao-AILab/fast-hadamard-transform",
                               "summary": "Fast Hadamard Transform in CUDA, with a PyTorch interface",
                               "license": "BSD-3-Clause"}
    cached = recipe["source"]["url"][0]
    assert cached.endswith(f"/sha256/{sha}/v1.1.0.tar.gz") and recipe["source"]["url"][1] == TAG_ARCHIVE
    # The archive saved under the URL's name goes where the recipe's first URL looks.
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "v1.1.0.tar.gz").write_bytes(tree.read_bytes())
    dest = tmp_path / "sources"
    assert main(["sources", "fetch", str(folder), "--from", str(tmp_path / "saved"), "--dest", str(dest), "--json"]) == 0
    (got,) = json.loads(capsys.readouterr().out)["sources"]
    assert cached.replace('${{ env.get("EXTFORGE_SOURCES", default="/nonexistent") }}', str(dest)) == f"file://{got['path']}"


def test_an_archive_without_pkg_info_must_name_its_release(tmp_path: Path, capsys) -> None:
    """A tree whose setup.py computes its version and whose package has no __version__ line gives
    no release to check against NAME==VERSION: refused in one line; one of another release is
    refused as an sdist of another release is."""
    computed = {**TREE, "fast_hadamard_transform/__init__.py": ""}
    tree = tar_gz(tmp_path / "a" / "fast-hadamard-transform-1.1.0.tar.gz", "fast-hadamard-transform-1.1.0", computed)
    assert main(["recipe", "new", "fast-hadamard-transform==1.1.0", "--sdist", str(tree), "--dest", str(tmp_path)]) == 2
    assert "has no PKG-INFO, and its setup.py computes its version" in capsys.readouterr().err
    tree = tar_gz(tmp_path / "b" / "fast-hadamard-transform-1.1.0.tar.gz", "fast-hadamard-transform-1.1.0", TREE)
    assert main(["recipe", "new", "fast-hadamard-transform==1.2.0", "--sdist", str(tree), "--dest", str(tmp_path)]) == 2
    assert "is fast_hadamard_transform 1.1.0, not fast-hadamard-transform 1.2.0" in capsys.readouterr().err
    assert not (tmp_path / "fast-hadamard-transform").exists()
