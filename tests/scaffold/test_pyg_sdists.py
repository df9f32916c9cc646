"""`extforge recipe new` on the real torch-cluster 1.6.3 and torch-scatter 2.1.2 sdists (from the
source cache, fetched once, checked against the recipes' sha256): the recipes in recipe/ are its
output byte for byte, every switch decided from what the sdist shows, the torch.ops test, where
upstream keeps the tests and what a channel lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from extforge.cli import main
from extforge.errors import ExtforgeError
from extforge.recipes import scaffold, sources

RECIPES = Path(__file__).resolve().parents[2] / "recipe"
RELEASES = {"torch-cluster": "1.6.3", "torch-scatter": "2.1.2"}


def cached_sdist(name: str) -> Path:
    """The sdist the recipe pins, from the source cache (EXTFORGE_SOURCES or the default one);
    fetched into the default one where it is missing, sha256-checked either way."""
    spec = sources.read_spec(RECIPES / name)
    roots = [Path(os.environ["EXTFORGE_SOURCES"])] if os.environ.get("EXTFORGE_SOURCES") else []
    found = [p for p in (sources.stored_path(spec, r) for r in [*roots, sources.default_root()]) if p.is_file()]
    if found:
        return found[0]
    try:
        return sources.fetch(spec)[0]
    except ExtforgeError as e:
        pytest.skip(f"the {name} sdist is not in the source cache and could not be fetched: {e.what}")


def channel(folder: Path, names: list[str]) -> Path:
    """A channel folder whose index lists packages of these names."""
    for subdir in ("linux-64", "noarch"):
        (folder / subdir).mkdir(parents=True, exist_ok=True)
        packages = {f"{n}-1.0-0.tar.bz2": {"name": n, "version": "1.0", "build": "0", "build_number": 0, "depends": []}
                    for n in names} if subdir == "noarch" else {}
        (folder / subdir / "repodata.json").write_text(json.dumps({"info": {"subdir": subdir}, "packages": packages}))
    return folder


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_the_pyg_recipes_are_recipe_news_output_unedited(name: str, tmp_path: Path, capsys) -> None:
    """The old recipe new left the CUDA-or-CPU switch, ninja and the op test to the user (torch-
    scatter's recipe carried a FORCE_CUDA=1 and a sed line by hand); now the recipe it writes is
    the one in recipe/, and only the channel is left to check."""
    sdist = cached_sdist(name)
    url = sources.read_spec(RECIPES / name).urls[-1]
    full = channel(tmp_path / "channel", ["python", "pytorch", "scipy", "pytest", "pytest-cov"])
    code = main(["recipe", "new", f"{name}=={RELEASES[name]}", "--sdist", str(sdist), "--url", url,
                 "--dest", str(tmp_path / "recipes"), "-c", str(full), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["undecided"] == [] and out["channel_lacks"] == [], out
    assert (tmp_path / "recipes" / name / "recipe.yaml").read_text() == (RECIPES / name / "recipe.yaml").read_text()
    # The archs are the build layer's (9.0): neither has a variants.yaml of its own.
    assert not (tmp_path / "recipes" / name / "variants.yaml").exists() and not (RECIPES / name / "variants.yaml").exists()
    assert [(d["decides"], d["set"]) for d in out["decided"]] == [
        ("CUDA or CPU", {"FORCE_ONLY_CUDA": "1"}), ("ahead of time or at first use", {"BUILD_DOCS": "0"}),
        ("ninja", {"EXTFORGE_NINJA": "on"})]
    module = name.replace("-", "_")
    assert out["imports"] == [module] and f"ops = torch.ops.{module};" in out["ops_test"]
    assert "v = ops.cuda_version()" in out["ops_test"] and "'cuda_version'" in out["ops_test"]
    repo = {"torch-cluster": "pytorch_cluster", "torch-scatter": "pytorch_scatter"}[name]
    assert out["upstream_tests"] == {"in_sdist": [], "folder": "test", "requires": ["pytest", "pytest-cov"], "imports": [],
                                     "url": f"https://github.com/rusty1s/{repo}/tree/{RELEASES[name]}/test"}


def test_torch_clusters_registered_ops_are_its_test(tmp_path: Path) -> None:
    """The old recipe new wrote no torch.ops test (its op libraries cannot be imported) and the
    license "UNKNOWN" setuptools wrote into PKG-INFO."""
    made = scaffold.scaffold(scaffold.read_sdist(cached_sdist("torch-cluster")), scaffold.Sdist(
        "torch_cluster-1.6.3.tar.gz", "https://x.org/torch_cluster-1.6.3.tar.gz", "0" * 64), ("9.0",))
    assert made.ops == scaffold.OpsTest("torch_cluster", "torch_cluster", (
        "cuda_version", "fps", "graclus", "grid", "knn", "nearest", "neighbor_sampler", "radius", "random_walk"))
    # setuptools wrote License: UNKNOWN; the MIT classifier names it.
    assert made.license == "MIT" and made.run == ["scipy"]


def test_a_channel_without_the_run_requirement_is_named_with_the_mirror_command(tmp_path: Path, capsys) -> None:
    """The user had to spot that the demo channel lacked scipy (a run requirement: the build's own
    tests cannot solve) and pytest (upstream's tests) and re-mirror with --extra."""
    sdist, url = cached_sdist("torch-cluster"), sources.read_spec(RECIPES / "torch-cluster").urls[-1]
    bare = channel(tmp_path / "bare channel", ["python", "pytorch"])
    code = main(["recipe", "new", "torch-cluster==1.6.3", "--sdist", str(sdist), "--url", url, "--dest", str(tmp_path / "r"),
                 "-c", str(bare), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["channel_lacks"] == [{"name": "scipy", "pypi": "scipy", "for": "run"},
                                    {"name": "pytest", "pypi": "pytest", "for": "upstream's tests"},
                                    {"name": "pytest-cov", "pypi": "pytest-cov", "for": "upstream's tests"}]
    assert out["mirror_command"] == f"extforge mirror --channel '{bare}' --extra scipy --extra pytest --extra pytest-cov"
    # Upstream's tests alone missing is no finding: the package builds and tests without them.
    assert main(["recipe", "new", "torch-cluster==1.6.3", "--sdist", str(sdist), "--url", url, "--dest",
                 str(tmp_path / "r2"), "-c", str(channel(tmp_path / "ch2", ["python", "pytorch", "scipy"]))]) == 0
    assert "lacks: pytest (upstream's tests), pytest-cov (upstream's tests)" in capsys.readouterr().err


STUB_TORCH = {
    "torch/__init__.py": "cuda = type('cuda', (), {'is_available': staticmethod(lambda: False)})\n"
                         "version = type('version', (), {'hip': None, 'cuda': '13.0'})\n",
    "torch/__config__.py": "def parallel_info():\n    return 'ATen/Parallel:\\n\\tbackend: OpenMP'\n",
    "torch/utils/__init__.py": "",
    "torch/utils/cpp_extension.py": "from setuptools import Extension\nCUDA_HOME = None\n"
                                    "class BuildExtension:\n    @classmethod\n    def with_options(cls, **kw):\n"
                                    "        return cls\n"
                                    "def CppExtension(name, sources, **kw):\n    return ('cpu', name, sources)\n"
                                    "def CUDAExtension(name, sources, **kw):\n    return ('cuda', name, sources)\n",
}


@pytest.mark.parametrize(("name", "count"), [("torch-cluster", 9), ("torch-scatter", 4)])
def test_force_only_cuda_builds_half_the_extensions_each_with_the_cpu_kernels(name: str, count: int,
                                                                              tmp_path: Path) -> None:
    """What the data row claims, on upstream's own setup.py and __init__.py (run here, with a
    stub torch, never by recipe new): FORCE_ONLY_CUDA=1 builds half of FORCE_CUDA=1's extensions,
    each CUDA one compiling its op's CPU source too, and the package loads `_cuda` before `_cpu`.
    (The evidence for build-switches.yaml's row, which the old code had no row for.)"""
    with tarfile.open(cached_sdist(name)) as tar:
        tar.extractall(tmp_path, filter="data")
    (src,) = tmp_path.iterdir()
    for rel, text in STUB_TORCH.items():
        (tmp_path / "stub" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stub" / rel).write_text(text)
    probe = ("import json, setuptools, sys\nseen = []\nsetuptools.setup = lambda **kw: seen.extend(kw['ext_modules'])\n"
             "sys.argv = ['setup.py']\nexec(compile(open('setup.py').read(), 'setup.py', 'exec'), {'__name__': '__main__'})\n"
             "print(json.dumps(seen))\n")

    def extensions(switch: str) -> list[list]:
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), switch: "1"}
        return json.loads(subprocess.run([sys.executable, "-c", probe], cwd=src, env=env, capture_output=True, text=True,
                                         check=True).stdout)

    both, only_cuda = extensions("FORCE_CUDA"), extensions("FORCE_ONLY_CUDA")
    assert (len(both), len(only_cuda)) == (2 * count, count)
    assert {kind for kind, _, _ in only_cuda} == {"cuda"}
    for _, module, files in only_cuda:
        op = module.split("._")[-1].removesuffix("_cuda")
        cpu = f"csrc/cpu/{op}_cpu.cpp"
        assert (cpu in files) == (src / cpu).exists(), (module, files)
    assert "cuda_spec or cpu_spec" in (src / name.replace("-", "_") / "__init__.py").read_text()
