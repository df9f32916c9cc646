"""A setup.py that globs its sources (torch-cluster's and torch-scatter's
`glob.glob(osp.join(extensions_dir, '*.cpp'))`) is counted from the sdist's file list, so the
planner's default estimate is over the compiles the build runs, not one wave of the cores."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from extforge.cli import main
from extforge.recipes import scaffold
from sdists import tar_gz

# torch-cluster 1.6.3's get_extensions(), as upstream writes it (its other lines do not matter here).
SETUP_PY = '''\
import glob
import os
import os.path as osp
from itertools import product

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

suffices = ['cuda', 'cpu']
if os.getenv('FORCE_ONLY_CUDA', '0') == '1':
    suffices = ['cuda']


def get_extensions():
    extensions = []

    extensions_dir = osp.join('csrc')
    main_files = glob.glob(osp.join(extensions_dir, '*.cpp'))
    # remove generated 'hip' files, in case of rebuilds
    main_files = [path for path in main_files if 'hip' not in path]

    for main, suffix in product(main_files, suffices):
        name = main.split(os.sep)[-1][:-4]
        sources = [main]

        path = osp.join(extensions_dir, 'cpu', f'{name}_cpu.cpp')
        if osp.exists(path):
            sources += [path]

        path = osp.join(extensions_dir, 'cuda', f'{name}_cuda.cu')
        if suffix == 'cuda' and osp.exists(path):
            sources += [path]

        Extension = CppExtension if suffix == 'cpu' else CUDAExtension
        extension = Extension(f'torch_cluster._{name}_{suffix}', sources, include_dirs=[extensions_dir])
        extensions += [extension]

    return extensions


setup(
    name='torch_cluster',
    version='1.6.3',
    install_requires=['scipy'],
    ext_modules=get_extensions(),
    cmdclass={'build_ext': BuildExtension.with_options(no_python_abi_suffix=True, use_ninja=False)},
    packages=find_packages(),
)
'''
MAIN = ["fps", "graclus", "grid", "knn", "nearest", "radius", "rw", "sampler", "version"]
CPU = ["fps", "graclus", "grid", "knn", "radius", "rw", "sampler"]
CUDA = ["fps", "graclus", "grid", "knn", "nearest", "radius", "rw"]


def sdist(where: Path) -> Path:
    """torch_cluster-1.6.3.tar.gz's files (sources empty: only their names are read)."""
    names = {"PKG-INFO": "Metadata-Version: 2.1\nName: torch_cluster\nVersion: 1.6.3\n", "setup.py": SETUP_PY,
             "torch_cluster/__init__.py": "", "csrc/cluster.h": "", "csrc/cpu/utils.h": "",
             **{f"csrc/{m}.cpp": "" for m in MAIN}, **{f"csrc/cpu/{c}_cpu.cpp": "" for c in CPU},
             **{f"csrc/cpu/{c}_cpu.h": "" for c in CPU}, **{f"csrc/cuda/{c}_cuda.cu": "" for c in CUDA}}
    return tar_gz(where / "torch_cluster-1.6.3.tar.gz", "torch_cluster-1.6.3", names)


def test_a_globbing_setup_py_is_counted_from_the_sdists_files(tmp_path: Path) -> None:
    """The 23 compiles of a FORCE_ONLY_CUDA build: 9 main files, 7 cpu/ and 7 cuda/ ones (the
    old code could not count a setup.py that computes its sources: None)."""
    facts = scaffold.read_sdist(sdist(tmp_path))
    assert facts.setup is not None and facts.setup.globbed == ["csrc"]
    assert scaffold.translation_units(facts.setup, facts.compiled) == 23 == scaffold.sdist_units(sdist(tmp_path))
    # Without the file list (or glob), nothing is guessed.
    assert scaffold.translation_units(facts.setup) is None
    assert scaffold.read_setup_py("import glob\nsrc = glob.glob(make_dir() + '/*.cu')\n").globbed == []
    assert scaffold.read_setup_py("import os, glob\nhere = os.path.dirname(os.path.abspath(__file__))\n"
                                  "glob.glob(os.path.join(here, 'csrc', '**', '*.cu'), recursive=True)\n").globbed == ["csrc"]


def test_plan_of_a_recipe_counts_its_globbed_sdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`extforge plan RECIPE` plans torch-cluster, never built here, over its 23 units: the old code
    took one wave of the cores (~4 min on the 2 cores where the build took 19 min 49 s)."""
    archive = sdist(tmp_path / "dist")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    store = tmp_path / "sources"
    (store / "sha256" / sha).mkdir(parents=True)
    (store / "sha256" / sha / archive.name).write_bytes(archive.read_bytes())
    monkeypatch.setenv("EXTFORGE_SOURCES", str(store))
    recipe = tmp_path / "torch-cluster"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text(
        "schema_version: 1\ncontext:\n  version: \"1.6.3\"\npackage:\n  name: torch-cluster\n  version: ${{ version }}\n"
        "source:\n  url:\n    - file://${{ env.get(\"EXTFORGE_SOURCES\", default=\"/nonexistent\") }}/sha256/"
        f"{sha}/{archive.name}\n  sha256: {sha}\nbuild:\n  script: [echo]\n")
    assert main(["plan", str(recipe), "--cores", "2", "--memory", "24G", "--archs", "90", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["plan"]
    assert any(r.startswith("23 translation units") for r in planned["reasons"]), planned["reasons"]
    assert planned["expected_wall_seconds"] > 15 * 60
