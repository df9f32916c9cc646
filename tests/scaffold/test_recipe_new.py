"""`extforge recipe new`: a recipe from a real sdist (made here by setuptools from a torch-style
setup.py), read without running its setup.py and without the network."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from extforge.cli import main
from extforge.errors import ExtforgeError
from extforge.hashing import sha256_file
from extforge.recipes import scaffold, sources
from extforge.recipes.variants import Matrix, render
from servers import serving

# Shaped like causal-conv1d 1.7.0's: its own -gencode flags, a prebuilt-wheel switch, find_packages.
SETUP_PY = '''\
import os
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

PACKAGE_NAME = "tiny_conv"
FORCE_BUILD = os.getenv("TINY_CONV_FORCE_BUILD", "FALSE") == "TRUE"
cc_flag = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_90,code=sm_90"]
SOURCES = ["csrc/tiny_conv.cpp", "csrc/tiny_conv_fwd.cu", "csrc/tiny_conv_bwd.cu"]
ext_modules = []
ext_modules.append(
    CUDAExtension(
        name="tiny_conv_cuda",
        sources=SOURCES,
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"] + cc_flag},
    )
)
setup(
    name="tiny-conv",
    version="1.7.0",
    packages=find_packages(exclude=("build", "csrc", "tiny_conv.egg-info")),
    description="Tiny causal conv: a test extension",
    url="https://example.org/tiny-conv",
    license="BSD-3-Clause",
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.1", "packaging", "ninja", "einops>=0.7", "triton; platform_system == 'Linux'"],
    extras_require={"viz": ["matplotlib"]},
)
'''
PYPROJECT = '[build-system]\nrequires = ["setuptools>=61", "wheel", "torch", "packaging", "ninja", "pybind11>=2.10"]\n'
# What setup.py imports from torch, enough for setuptools to write the sdist (no torch here).
TORCH_STUB = '''\
from setuptools import Extension
from setuptools.command.build_ext import build_ext as BuildExtension


def CUDAExtension(name, sources, **kwargs):
    return Extension(name, sources)


CppExtension = CUDAExtension
'''


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-conv")
    project, stub = root / "project", root / "stub" / "torch" / "utils"
    files = {"setup.py": SETUP_PY, "pyproject.toml": PYPROJECT, "MANIFEST.in": "recursive-include tests *.py\n",
             "tiny_conv/__init__.py": "", "tiny_conv/ops.py": "", "tests/__init__.py": "", "tests/test_ops.py": "",
             "csrc/tiny_conv.cpp": "", "csrc/tiny_conv_fwd.cu": "", "csrc/tiny_conv_bwd.cu": ""}
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    stub.mkdir(parents=True)
    for init in (stub.parent / "__init__.py", stub / "__init__.py"):
        init.write_text("")
    (stub / "cpp_extension.py").write_text(TORCH_STUB)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(root / "dist")], cwd=project, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(root / "stub")})
    (path,) = (root / "dist").iterdir()
    return path


def test_setup_py_is_read_not_run(sdist: Path) -> None:
    facts = scaffold.read_sdist(sdist)
    assert (facts.name, facts.version, facts.summary) == ("tiny-conv", "1.7.0", "Tiny causal conv: a test extension")
    # setuptools of this age writes the requirements beside PKG-INFO, not in it.
    assert facts.requires_from == "egg-info/requires.txt" and "einops>=0.7" in facts.requires
    assert 'matplotlib; extra == "viz"' in facts.requires and facts.top_level == ["tests", "tiny_conv", "tiny_conv_cuda"]
    assert facts.setup is not None
    assert facts.setup.extensions == [scaffold.Extension(
        "tiny_conv_cuda", "CUDAExtension", ("csrc/tiny_conv.cpp", "csrc/tiny_conv_fwd.cu", "csrc/tiny_conv_bwd.cu"))]
    assert facts.setup.archs == ["75", "90"] and facts.setup.switches == ["TINY_CONV_FORCE_BUILD"]
    assert sorted(facts.package_dirs) == ["tests", "tiny_conv"]


def test_computed_names_and_requirements_are_said_not_guessed() -> None:
    facts = scaffold.read_setup_py(
        "from torch.utils.cpp_extension import CUDAExtension\nimport setuptools\nNAME = 'x'\n"
        "exts = [CUDAExtension(f'{NAME}._C', sources=glob('*.cu'))]\n"
        "setuptools.setup(install_requires=open('r.txt').read().split(), packages=['x', 'x.sub'])\n")
    assert facts.extensions == [] and facts.unnamed == 1 and facts.packages == ["x", "x.sub"]
    assert any("computes install_requires" in u for u in facts.undecided)
    assert any("a CUDAExtension whose name it computes" in u for u in facts.computed_names)
    assert scaffold.conda_spec("torch>=2.1,<3") == ("pytorch <3,>=2.1", None)
    assert scaffold.conda_spec("Flash_Attn==2.8.3")[0] == "flash-attn ==2.8.3"
    assert scaffold.conda_spec("matplotlib; extra == 'viz'")[0] is None
    assert "is not for linux-64" in str(scaffold.conda_spec("pywin32; sys_platform == 'win32'")[1])
    assert "depends on the python" in str(scaffold.conda_spec("tomli; python_version < '3.11'")[1])


def test_extensions_built_only_under_a_switch_are_decided_or_named() -> None:
    """gsplat 1.5.3's shape: its PyPI wheel is built with BUILD_NO_CUDA=1 and compiles at first use.
    A known switch is set with its reason (the old code only named it); an unknown one is named."""
    def made(switch: str) -> scaffold.Scaffold:
        setup = scaffold.read_setup_py(
            f"import os\nfrom setuptools import setup\n{switch} = os.getenv('{switch}', '0') == '1'\n"
            "MAX_JOBS = os.environ.get(\"MAX_JOBS\")\n"
            f"setup(name='g', ext_modules=get_extensions() if not {switch} else [])\n")
        facts = scaffold.SdistFacts("g", "1.0", license="MIT", setup=setup, package_dirs=["g"])
        return scaffold.scaffold(facts, scaffold.Sdist("g-1.0.tar.gz", "https://x.org/g-1.0.tar.gz", "0" * 64), ("9.0",))

    known = made("BUILD_NO_CUDA")
    assert [(d.decides, dict(d.values)) for d in known.decisions] == [("ahead of time or at first use", {"BUILD_NO_CUDA": "0"})]
    assert not any("compiles its extensions only if" in u for u in known.undecided)
    assert '      # ahead of time or at first use: compile the kernels here, ahead of time (PyPI\'s wheel, BUILD_NO_CUDA=1, ' \
        in known.recipe_yaml() and '      BUILD_NO_CUDA: "0"\n' in known.recipe_yaml()
    said = [u for u in made("NO_EXT").undecided if "compiles its extensions only if" in u]
    assert said == ["setup.py line 5 compiles its extensions only if `not NO_EXT` (it reads MAX_JOBS, NO_EXT from the "
                    "environment): set what keeps them in build.script.env, else the package has no compiled module "
                    "(the import test fails)"]


def test_recipe_new_offline_writes_the_recipe_shape(tmp_path: Path, sdist: Path, capsys) -> None:
    code = main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path), "--json",
                 "--archs", "8.0,9.0"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # written, with what it could not decide
    folder = tmp_path / "tiny-conv"
    assert out["recipe"] == str(folder) and out["imports"] == ["tiny_conv", "tiny_conv_cuda"]
    # triton's marker holds on linux-64, the only platform built for.
    assert out["translation_units"] == 3 and out["run"] == ["packaging", "einops >=0.7", "triton"]
    undecided = "\n".join(out["undecided"])
    # An unknown download switch is left to the author; upstream's arch list is not (the build layer replaces it).
    for said in ("derived from the file name", "TINY_CONV_FORCE_BUILD", "torch>=2.1", "optional extra"):
        assert said in undecided, said
    assert "sm_75" not in undecided
    recipe = YAML(typ="safe").load((folder / "recipe.yaml").read_text())
    sha = sha256_file(sdist)
    assert recipe["context"] == {"name": "tiny-conv", "version": "1.7.0"}
    assert recipe["source"] == {"sha256": sha, "url": [
        f'file://${{{{ env.get("EXTFORGE_SOURCES", default="/nonexistent") }}}}/sha256/{sha}/{sdist.name}',
        f"https://files.pythonhosted.org/packages/source/t/tiny-conv/{sdist.name}"]}
    assert recipe["build"]["script"] == {"env": {"TORCH_CUDA_ARCH_LIST": "${{ cuda_archs }}"},
                                         "content": ["${{ PYTHON }} -m pip install . --no-deps --no-build-isolation -v"]}
    assert recipe["requirements"]["build"][3:] == ["extforge-torch-build", "ninja"]
    assert recipe["requirements"]["host"] == ["python", "pip", "setuptools", "wheel", "packaging", "ninja", "pytorch",
                                              "cuda-version ${{ cuda_compiler_version }}.*", "pybind11 >=2.10"]
    # torch's exact pin is its run_exports': python, cuda-version, then upstream's own.
    assert recipe["requirements"]["run"][2:] == ["packaging", "einops >=0.7", "triton"]
    assert "string" not in recipe["build"]  # the build layer's
    assert recipe["tests"] == [{"python": {"imports": ["tiny_conv", "tiny_conv_cuda"], "pip_check": False}}]
    assert recipe["about"] == {"homepage": "https://example.org/tiny-conv", "summary": "Tiny causal conv: a test extension",
                               "license": "BSD-3-Clause"}
    assert YAML(typ="safe").load((folder / "variants.yaml").read_text()) == {"cuda_archs": ["8.0;9.0"]}
    # Written once; a second run asks before it overwrites.
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err
    # Without --archs no variants.yaml: the build layer's gives the archs (9.0), as it gives the build
    # string; one that --force would leave behind would keep its archs over the layer's.
    main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path), "--force", "--json"])
    assert json.loads(capsys.readouterr().out)["files"] == [str(folder / "recipe.yaml")]
    assert not (folder / "variants.yaml").exists()


def test_the_recipe_renders_for_a_channel_row(tmp_path: Path, sdist: Path) -> None:
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path),
                 "--url", "https://example.invalid/tiny-conv-1.7.0.tar.gz"]) == 1
    row = {"python": ["3.12"], "pytorch": ["2.14.1"], "cuda_compiler_version": ["13.0"], "cxx_abi": ["cxx11"],
           "cuda_archs": ["9.0"]}
    (variant,) = render(tmp_path / "tiny-conv" / "recipe.yaml", Matrix(row, [], []))
    d = variant.recipe.to_dict()
    assert d["build"]["string"].startswith("cuda130_torch214_py312_cxx11_h")  # the build layer's scheme
    assert d["source"][0]["url"][-1] == "https://example.invalid/tiny-conv-1.7.0.tar.gz"


def test_sources_fetch_on_a_recipe_whose_build_string_needs_the_channel(tmp_path: Path, sdist: Path, capsys) -> None:
    """The build string names python, pytorch and the CUDA toolkit, which only a channel's
    variants.yaml defines: fetching the sources needs none of them."""
    main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path / "recipes")])
    recipe, dest = tmp_path / "recipes" / "tiny-conv", tmp_path / "sources"
    assert main(["sources", "fetch", str(recipe), "--from", str(sdist.parent), "--dest", str(dest), "--json"]) == 0
    (got,) = json.loads(capsys.readouterr().out)["sources"]
    assert got["how"] == "folder" and Path(got["path"]) == dest / "sha256" / sha256_file(sdist) / sdist.name
    # With a channel, its variants fill what the recipe's sources may name.
    channel = tmp_path / "channel"
    channel.mkdir()
    (channel / "variants.yaml").write_text('python: ["3.12"]\npytorch: ["2.14.1"]\ncuda_compiler_version: ["13.0"]\n')
    assert main(["sources", "path", str(recipe), "-c", str(channel), "--dest", str(dest)]) == 0
    assert capsys.readouterr().out.strip() == got["path"]
    spec = sources.read_spec(recipe)
    assert (spec.name, spec.version, spec.is_sdist) == ("tiny-conv", "1.7.0", True)


def test_a_sdist_of_another_release_is_refused(tmp_path: Path, sdist: Path, capsys) -> None:
    assert main(["recipe", "new", "tiny-conv==1.8.0", "--sdist", str(sdist), "--dest", str(tmp_path)]) == 2
    assert "not tiny-conv 1.8.0" in capsys.readouterr().err
    assert not (tmp_path / "tiny-conv").exists()
    assert main(["recipe", "new", "tiny-conv", "--dest", str(tmp_path)]) == 2


def test_pypi_json_gives_the_sdist() -> None:
    data = {"urls": [{"packagetype": "bdist_wheel", "filename": "x.whl", "url": "https://h/x.whl", "digests": {"sha256": "a"}},
                     {"packagetype": "sdist", "filename": "causal_conv1d-1.7.0.tar.gz",
                      "url": "https://files.pythonhosted.org/packages/aa/bb/causal_conv1d-1.7.0.tar.gz",
                      "digests": {"sha256": "c" * 64}}]}
    assert scaffold.sdist_from_pypi_json(data, "causal-conv1d", "1.7.0") == scaffold.Sdist(
        "causal_conv1d-1.7.0.tar.gz", "https://files.pythonhosted.org/packages/aa/bb/causal_conv1d-1.7.0.tar.gz", "c" * 64)
    with pytest.raises(Exception, match="no sdist"):
        scaffold.sdist_from_pypi_json({"urls": data["urls"][:1]}, "x", "1")



def test_plan_for_a_new_recipe_counts_its_units_from_the_cached_sdist(tmp_path: Path, sdist: Path, monkeypatch,
                                                                       capsys) -> None:
    main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path), "--archs", "80,90"])
    recipe, store = tmp_path / "tiny-conv", tmp_path / "sources"
    monkeypatch.setenv("EXTFORGE_SOURCES", str(store))
    plan_args = ["plan", str(recipe), "--cores", "64", "--memory", "512G", "--json"]
    capsys.readouterr()
    assert main(plan_args) == 0
    before = json.loads(capsys.readouterr().out)["plan"]
    assert before["profile"] == "tiny-conv" and before["archs"] == ["80", "90"]
    assert main(["sources", "fetch", str(recipe), "--from", str(sdist.parent), "--dest", str(store)]) == 0
    capsys.readouterr()
    assert main(plan_args) == 0
    after = json.loads(capsys.readouterr().out)["plan"]
    # setup.py lists three sources: no more than three jobs, however big the node.
    assert after["numbers_from"].startswith("default estimate") and after["max_jobs"] == 3 < before["max_jobs"]


def test_recipe_new_from_an_index_checks_the_sdist_it_downloads(tmp_path: Path, sdist: Path, capsys) -> None:
    """PyPI's JSON API, as a site's proxy (here a folder) serves it: the sdist's URL and sha256."""
    def index(sha256: str) -> str:
        release = tmp_path / f"index-{sha256[:4]}" / "tiny-conv" / "1.7.0"
        release.mkdir(parents=True)
        (release / "json").write_text(json.dumps({"urls": [{"packagetype": "sdist", "filename": sdist.name,
                                                           "url": sdist.as_uri(), "digests": {"sha256": sha256}}]}))
        return release.parents[1].as_uri()

    good = index(sha256_file(sdist))
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--index", good, "--dest", str(tmp_path / "r"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["sdist"] == {"filename": sdist.name, "url": sdist.as_uri(), "sha256": sha256_file(sdist)}
    assert not any("derived" in u for u in out["undecided"])
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--index", index("0" * 64), "--dest", str(tmp_path / "s")]) == 2
    assert "does not match the sha256" in capsys.readouterr().err and not (tmp_path / "s").exists()
    # A proxy that serves only the project's page: its `releases` hold the version's files.
    project = tmp_path / "project-only" / "tiny-conv"
    project.mkdir(parents=True)
    files = [{"packagetype": "sdist", "filename": sdist.name, "url": sdist.as_uri(), "digests": {"sha256": sha256_file(sdist)}}]
    (project / "json").write_text(json.dumps({"releases": {"1.7.0": files, "1.6.0": []}}))
    assert scaffold.pypi_sdist("tiny_conv", "1.7.0", project.parent.as_uri()).sha256 == sha256_file(sdist)
    with pytest.raises(ExtforgeError, match="1.8.0/json"):
        scaffold.pypi_sdist("tiny-conv", "1.8.0", project.parent.as_uri())


# Round 4 (issue #53): what the index and the sdist say is untrusted; every fetch is bounded.
PKG_INFO = b"Metadata-Version: 2.1\nName: tiny-conv\nVersion: 1.7.0\n"


def _crafted(where: Path, files: dict[str, bytes]) -> Path:
    """A tiny-conv 1.7.0 sdist holding exactly `files` below its top folder."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tiny_conv-1.7.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"tiny_conv-1.7.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _release(**sdist: object) -> bytes:
    """PyPI's JSON page of a release whose one file is this sdist entry."""
    return json.dumps({"urls": [{"packagetype": "sdist", **sdist}]}).encode()


@pytest.mark.parametrize("filename", ["../escaped.tar.gz", "ABSOLUTE"])
def test_an_index_file_name_that_leaves_the_temp_folder_is_refused(tmp_path: Path, sdist: Path, monkeypatch,
                                                                   capsys, filename: str) -> None:
    """The old code downloaded to <its temp folder>/<the index's filename>: `../x` landed one
    folder up, an absolute name wherever it pointed; then it wrote the recipe."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside.tar.gz"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    filename = str(outside) if filename == "ABSOLUTE" else filename
    routes: dict[str, bytes | str] = {"/files/tiny_conv-1.7.0.tar.gz": sdist.read_bytes()}
    with serving(routes) as (url, _sent):
        routes["/pypi/tiny-conv/1.7.0/json"] = _release(filename=filename, url=f"{url}/files/tiny_conv-1.7.0.tar.gz",
                                                         digests={"sha256": sha256_file(sdist)})
        code = main(["recipe", "new", "tiny-conv==1.7.0", "--index", f"{url}/pypi", "--dest", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "names an sdist recipe new cannot use" in err and "is not a plain file name" in err, err
    assert not (scratch / "escaped.tar.gz").exists() and not outside.exists() and not (tmp_path / "r").exists()
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("listed", [True, False], ids=["index-size", "no-size"])
def test_an_endless_sdist_download_stops(tmp_path: Path, sdist: Path, monkeypatch, capsys, listed: bool) -> None:
    """The old code read until the server stopped (an endless body filled a test machine's
    disk; this server gives up at 64 MiB): now at the size the index lists, or, where it lists
    none, at $EXTFORGE_DOWNLOAD_MAX_MIB."""
    monkeypatch.setenv("EXTFORGE_DOWNLOAD_MAX_MIB", "1")
    size = {"size": sdist.stat().st_size} if listed else {}
    routes: dict[str, bytes | str] = {"/files/tiny_conv-1.7.0.tar.gz": "zeros"}
    with serving(routes, most=64 * 2**20) as (url, sent):
        routes["/pypi/tiny-conv/1.7.0/json"] = _release(filename=sdist.name, url=f"{url}/files/tiny_conv-1.7.0.tar.gz",
                                                         digests={"sha256": sha256_file(sdist)}, **size)
        code = main(["recipe", "new", "tiny-conv==1.7.0", "--index", f"{url}/pypi", "--dest", str(tmp_path / "r")])
    err = capsys.readouterr().err
    said = f"gave more than the {sdist.stat().st_size} bytes the index lists" if listed else "is larger than 1 MiB"
    assert code == 2 and said in err, err
    assert sent[0] < 32 * 2**20 and not (tmp_path / "r").exists()


def test_a_huge_metadata_member_is_refused_unread(tmp_path: Path, capsys) -> None:
    """A 1.5 GiB PKG-INFO compresses to 7 MB, and the old code read it whole (3.2 GB of memory);
    here 64 MiB of it: refused from its header, with a few MiB read."""
    path = _crafted(tmp_path, {"PKG-INFO": PKG_INFO + bytes(64 * 2**20)})
    tracemalloc.start()
    try:
        code = main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(path), "--dest", str(tmp_path / "r")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2 and "its tiny_conv-1.7.0/PKG-INFO is larger than the 8 MiB recipe new reads" in err, err
    assert peak < 32 * 2**20 and not (tmp_path / "r").exists()


def test_a_package_folder_name_cannot_write_a_test_into_the_recipe(tmp_path: Path, capsys) -> None:
    """A folder named with newlines became part of the `imports: [...]` line: the old code's
    recipe ran `touch PWNED` as a script test of its own."""
    evil = "x]\n  - script:\n      - touch PWNED\n  - python:\n      imports: [y"
    path = _crafted(tmp_path, {"PKG-INFO": PKG_INFO, "tiny_conv/__init__.py": b"", f"{evil}/__init__.py": b""})
    code = main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(path), "--dest", str(tmp_path), "--json",
                 "--url", "https://example.invalid/tiny_conv-1.7.0.tar.gz"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["imports"] == ["tiny_conv"]
    assert f"left out of tests.python.imports: {evil!r} is not a Python module name" in out["undecided"]
    recipe = YAML(typ="safe").load((tmp_path / "tiny-conv" / "recipe.yaml").read_text())
    assert recipe["tests"] == [{"python": {"imports": ["tiny_conv"], "pip_check": False}}]


def test_a_link_at_the_recipe_folder_is_refused_not_written_through(tmp_path: Path, sdist: Path, capsys) -> None:
    """--dest's <name> planted as a symlink: the old code wrote recipe.yaml into its target."""
    dest, elsewhere = tmp_path / "recipes", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "tiny-conv").symlink_to(elsewhere)
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(dest)]) == 2
    assert "tiny-conv in it is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_deep_nesting_and_a_truncated_archive_are_one_line(tmp_path: Path, sdist: Path, monkeypatch, capsys) -> None:
    """The old code failed unexpectedly: RecursionError from tomllib and from ast (a deep
    pyproject.toml or setup.py), EOFError from gzip (an archive cut short)."""
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))  # where the old code's crash log went
    deep = _crafted(tmp_path / "deep", {"PKG-INFO": PKG_INFO, "pyproject.toml": b"a = " + b"[" * 10**5 + b"]" * 10**5,
                                        "setup.py": b"x = f" + b"()" * 10**5})
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(deep), "--dest", str(tmp_path / "r"), "--json"]) == 1
    undecided = json.loads(capsys.readouterr().out)["undecided"]
    assert "pyproject.toml is nested too deeply to read: its build requirements not read" in undecided
    assert any(u.startswith("setup.py is nested too deeply to read") for u in undecided)
    cut = tmp_path / "cut" / sdist.name
    cut.parent.mkdir()
    cut.write_bytes(sdist.read_bytes()[: sdist.stat().st_size * 2 // 3])
    assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(cut), "--dest", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert f"cannot read the sdist {cut}" in err and "unexpectedly" not in err, err


def test_a_url_that_names_no_file_is_refused(tmp_path: Path, sdist: Path, capsys) -> None:
    """--url ending in `/..`: the recipe named it, and `sources fetch` took `..` for the file name."""
    for url in ("https://example.invalid/..", "https://example.invalid/dir/"):
        assert main(["recipe", "new", "tiny-conv==1.7.0", "--sdist", str(sdist), "--dest", str(tmp_path), "--url", url]) == 2
        assert "its URL ends in no file name" in capsys.readouterr().err
    assert not (tmp_path / "tiny-conv").exists()


def test_a_known_prebuilt_wheel_switch_is_set_with_its_reason() -> None:
    """causal-conv1d 1.7.0's setup.py downloads upstream's wheel unless CAUSAL_CONV1D_FORCE_BUILD
    is TRUE: the old recipe new left it to the layer, unnamed in the recipe; now the recipe sets
    download-switches.yaml's values under a one-line reason."""
    setup = scaffold.read_setup_py(
        "import os\nfrom setuptools import setup\nFORCE_BUILD = os.getenv('CAUSAL_CONV1D_FORCE_BUILD', 'FALSE') == 'TRUE'\n"
        "SKIP = os.getenv('CAUSAL_CONV1D_SKIP_CUDA_BUILD', 'FALSE') == 'TRUE'\nsetup(name='causal-conv1d')\n")
    facts = scaffold.SdistFacts("causal-conv1d", "1.7.0", license="BSD-3-Clause", setup=setup, package_dirs=["causal_conv1d"])
    made = scaffold.scaffold(facts, scaffold.Sdist("c-1.7.0.tar.gz", "https://x.org/c-1.7.0.tar.gz", "0" * 64), ("9.0",))
    (decision,) = made.decisions
    assert decision.decides == "build or download"
    assert dict(decision.values) == {"CAUSAL_CONV1D_FORCE_BUILD": "TRUE", "CAUSAL_CONV1D_SKIP_CUDA_BUILD": "FALSE"}
    assert ('      # build or download: compile here, never download upstream\'s prebuilt wheel (the build layer refuses '
            'the download either way)\n      CAUSAL_CONV1D_FORCE_BUILD: "TRUE"\n') in made.recipe_yaml()
    assert not any("a switch extforge does not know" in u for u in made.undecided)


def test_torch_library_ops_are_read_from_sources_within_a_budget(tmp_path: Path, monkeypatch) -> None:
    """Op libraries registered with TORCH_LIBRARY get the torch.ops test (the old recipe new wrote
    an import of each library, which fails: their PyInit returns NULL); C/C++ sources past the
    budget are not read (only named), whatever their size."""
    pkg_info = b"Metadata-Version: 2.1\nName: tiny-conv\nVersion: 1.7.0\nLicense: MIT\n"
    ops = (b'#include <torch/library.h>\nTORCH_LIBRARY(tiny_conv, m) {\n  m.def("scale(Tensor x) -> Tensor");\n'
           b'  m.def("tiny_conv::shift(Tensor x) -> Tensor");\n}\n')
    files = {"PKG-INFO": pkg_info, "setup.py": b"from setuptools import setup\nsetup(name='tiny-conv')\n",
             "tiny_conv/__init__.py": b"import torch\ntorch.ops.load_library(__file__.replace('__init__.py', '_C.so'))\n",
             "csrc/ops.cpp": ops, "csrc/big.cpp": b"//" + b"x" * 4096 + b'\n.op("tiny_conv::hidden", f)\n'}
    monkeypatch.setattr(scaffold, "SOURCES_BUDGET", len(ops) + 100)
    facts = scaffold.read_sdist(_crafted(tmp_path, files))
    assert "csrc/big.cpp" not in facts.texts and "csrc/big.cpp" in facts.compiled
    made = scaffold.scaffold(facts, scaffold.Sdist("tiny_conv-1.7.0.tar.gz", "https://x.org/t.tar.gz", "0" * 64), ("9.0",))
    assert made.ops == scaffold.OpsTest("tiny_conv", "tiny_conv", ("scale", "shift"))
    assert made.imports == ["tiny_conv"] and "print('tiny_conv: 2 ops')" in made.ops.command()
