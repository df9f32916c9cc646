"""The build layer compiles every extension of a setup.py in one ninja run (extforge_build_ext.py):
pyg's shape (one extension per op, 1-3 units each, torch's BuildExtension with use_ninja=False),
compiled by the real g++ and nvcc through torch's own BuildExtension."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from build_logs import build_log
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.planning import unit_costs
from extforge.recipes import build_layer
from package_files import package_member

LAYER = Path(build_layer.__file__).parents[1] / "data" / "torch-build"

# torch-cluster's setup.py, cut down: one extension per csrc/*.cpp, each with a source it shares
# with the others (`common.cpp`, compiled with that extension's macros) and, for b, a CUDA file.
SETUP_PY = '''\
import glob, os, os.path as osp
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

CUDA = os.getenv("WITH_CUDA_FILES", "0") == "1"
exts = []
for main in sorted(glob.glob(osp.join("csrc", "*.cpp"))):
    name = osp.basename(main)[:-4]
    for which in ((1, 2) if name == "a" else (1,)):
        sources = [main, "common/common.cpp"] + (["csrc/cuda/b_cuda.cu"] if CUDA and name == "b" else [])
        Extension = CUDAExtension if CUDA and name == "b" else CppExtension
        exts.append(Extension(f"pyg_shape._{name}_{which}", sources,
                              define_macros=[("WHICH", str(which)), ("EXT", f"_{name}_{which}")]))
setup(name="pyg-shape", version="1.0", packages=["pyg_shape"], ext_modules=exts,
      cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True, use_ninja=USE_NINJA)})
'''
MAIN = ("#include <Python.h>\n#define CAT2(a, b) a##b\n#define CAT(a, b) CAT2(a, b)\n"
        "PyMODINIT_FUNC CAT(PyInit_, EXT)(void) { return NULL; }\n")
COMMON = "#define CAT2(a, b) a##b\n#define CAT(a, b) CAT2(a, b)\nextern \"C\" int CAT(which_, WHICH)() { return WHICH; }\n"
KERNEL = "__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }\nvoid launch(float *x) { twice<<<1, 32>>>(x); }\n"


def project(root: Path, use_ninja: bool) -> Path:
    files = {"setup.py": SETUP_PY.replace("USE_NINJA", str(use_ninja)), "pyg_shape/__init__.py": "",
             "common/common.cpp": COMMON, "csrc/cuda/b_cuda.cu": KERNEL,
             **{f"csrc/{n}.cpp": MAIN for n in ("a", "b", "c")}}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def which_symbols(library: Path) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if "which_" in line)


def overlapping(edges: list[unit_costs.NinjaEdge]) -> int:
    """The most compiles running at once."""
    return max(count for _, count in unit_costs.running_counts(edges))


needs_compilers = pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("g++")), reason="no ninja or g++ here")


@needs_compilers
@pytest.mark.parametrize("mode", ["merged", "ordered", "separate", "parallel"])
def test_torchs_build_extension_compiles_all_extensions_in_one_ninja_run(mode: str, tmp_path: Path,
                                                                         pip_torch_venv: Path) -> None:
    """Under the layer, one ninja compiles the four extensions' eight units at once over MAX_JOBS
    slots, each extension's objects apart (a's two extensions compile common.cpp with their own
    macros: each library holds its own `which_N`). The old layer ran one ninja per extension,
    one after another (EXTFORGE_NINJA=separate keeps that). setuptools' own parallel build_ext
    (`[build_ext] parallel` through DIST_EXTRA_CONFIG) runs torch's ninja runs at once in one
    build folder: _a_2 linked _a_1's common.o (which_1) or the link failed; under the layer it
    is one ninja run all the same. ordered: the planner's unit order (one subninja per compile,
    each with its extension's variables) builds the same libraries."""
    src = project(tmp_path / "src", use_ninja=True)
    extra = tmp_path / "extra.cfg"
    extra.write_text("[build_ext]\nparallel = 4\n")
    env = {**os.environ, "PYTHONPATH": str(LAYER / "python"), "EXTFORGE_LAYER": "active", "MAX_JOBS": "3",
           "TORCH_NO_COMPILER_WRAPPER": "1", "CCACHE_DISABLE": "1",
           **({"EXTFORGE_NINJA": "separate"} if mode == "separate" else {}),
           **({"EXTFORGE_UNIT_ORDER": "c;common;b"} if mode == "ordered" else {}),
           **({"DIST_EXTRA_CONFIG": str(extra)} if mode == "parallel" else {})}
    proc = subprocess.run([str(pip_torch_venv / "bin" / "python"), "setup.py", "build_ext"], cwd=src, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (temp,) = (src / "build").glob("temp.*")
    edges = unit_costs.parse_ninja_log((temp / ".ninja_log").read_text())
    libraries = {p.name: which_symbols(p) for p in (src / "build").glob("lib.*/pyg_shape/*.so")}
    assert libraries == {"_a_1.so": ["which_1"], "_a_2.so": ["which_2"], "_b_1.so": ["which_1"], "_c_1.so": ["which_1"]}
    objects = sorted(p.relative_to(temp).as_posix() for p in temp.rglob("common.o"))
    if mode == "separate":  # one ninja run after another, each writing build_temp/common/common.o in turn
        assert objects == ["common/common.o"] and "in one ninja run" not in proc.stderr
        return
    assert unit_costs.ninja_runs(edges) == () and len(edges) == 8, edges
    assert "compiling 4 extensions in one ninja run (MAX_JOBS=3)" in proc.stderr
    # Each extension's objects below its own folder; ninja's log where readers look for it.
    assert objects == [f"pyg_shape/_{e}/common/common.o" for e in ("a_1", "a_2", "b_1", "c_1")]
    assert overlapping(edges) >= 2
    assert ("extforge-order" in (temp / "build.ninja").read_text()) is (mode == "ordered")


@needs_compilers
def test_ninja_is_turned_on_where_upstream_turned_it_off_only_when_asked(tmp_path: Path, pip_torch_venv: Path) -> None:
    """pyg's use_ninja=False: the old recipe turned ninja on with a sed line copied into its script;
    EXTFORGE_NINJA=on (what recipe new writes) has the layer do it, and without it upstream's
    choice stands (no ninja log: setuptools compiles one source at a time)."""
    src = project(tmp_path / "src", use_ninja=False)
    base = {**os.environ, "PYTHONPATH": str(LAYER / "python"), "EXTFORGE_LAYER": "active", "MAX_JOBS": "2",
            "TORCH_NO_COMPILER_WRAPPER": "1", "CCACHE_DISABLE": "1"}
    python = str(pip_torch_venv / "bin" / "python")
    subprocess.run([python, "setup.py", "build_ext"], cwd=src, env=base, capture_output=True, text=True, check=True)
    assert not list((src / "build").rglob(".ninja_log"))
    shutil.rmtree(src / "build")
    proc = subprocess.run([python, "setup.py", "build_ext"], cwd=src, env={**base, "EXTFORGE_NINJA": "on"},
                          capture_output=True, text=True, check=True)
    assert "ninja turned on (EXTFORGE_NINJA=on; upstream passes use_ninja=False)" in proc.stderr
    (log,) = (src / "build").rglob(".ninja_log")
    assert len(unit_costs.parse_ninja_log(log.read_text())) == 8


@pytest.mark.slow
def test_a_pyg_shaped_recipe_builds_its_extensions_in_one_ninja_run(tmp_path: Path, mirror_channel: Path) -> None:
    """The real build: rattler-build, the layer's activation, torch's BuildExtension with
    use_ninja=False and EXTFORGE_NINJA=on as recipe new writes it, g++ and nvcc through the
    layer's wrappers. The package's ninja log is one run of every unit (the old layer: no ninja
    log at all, setuptools compiling one source at a time), and the audit passes its sm_90 code."""
    folder = project(tmp_path / "pyg-shape" / "src", use_ninja=False).parent
    (folder / "recipe.yaml").write_text(
        "schema_version: 1\npackage: {name: pyg-shape, version: '1.0'}\nsource: {path: src}\n"
        "build:\n  script:\n    env:\n      TORCH_CUDA_ARCH_LIST: '9.0'\n      WITH_CUDA_FILES: '1'\n"
        "      EXTFORGE_NINJA: 'on'\n"
        "    content: ${{ PYTHON }} -m pip install . --no-deps --no-build-isolation -v\n"
        "requirements:\n  build:\n    - ${{ compiler('c') }}\n    - ${{ compiler('cxx') }}\n    - ${{ compiler('cuda') }}\n"
        "    - extforge-torch-build\n    - ninja\n"
        "  host:\n    - python\n    - pip\n    - setuptools\n    - pytorch\n")
    (built,) = build_recipe(BuildOptions.make(folder, [str(mirror_channel)], tmp_path / "out", test=False))
    assert built.audit_verdict == "pass", built
    paths = [p["_path"] for p in json.loads(package_member(built.path, "info/paths.json"))["paths"]]
    assert sorted(p.rsplit("/", 1)[-1] for p in paths if p.endswith(".so")) == ["_a_1.so", "_a_2.so", "_b_1.so", "_c_1.so"]
    edges = unit_costs.parse_ninja_log(package_member(built.path, "share/extforge/build/pyg-shape.ninja_log").decode())
    assert unit_costs.ninja_runs(edges) == () and len(edges) == 9
    log = build_log(tmp_path / "out", "pyg-shape").read_text()
    assert "ninja turned on" in log and "compiling 4 extensions in one ninja run" in log


def _layer_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("extforge_build_ext", LAYER / "python" / "extforge_build_ext.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two extensions' build.ninja in the shape torch writes them (variables, rules, then the edges);
# each compile records its output and its extension's flags, in the order ninja runs them.
EXTENSION_NINJA = """ninja_required_version = 1.3
cflags = -DEXT={ext}

rule compile
  command = echo $out $cflags >> {record} && touch $out
  description = compile $out

{edges}
"""


@pytest.mark.skipif(not shutil.which("ninja"), reason="no ninja here")
def test_one_ninja_run_starts_the_units_in_the_planners_order(tmp_path: Path) -> None:
    """ninja starts the ready edges in the order it read them: the old layer listed each
    extension's build.ninja in setup.py's order, so torch-cluster's longest units started last
    (on 16 cores its compile span was 122 s where the planner's longest-first order gives 89.6 s).
    With EXTFORGE_UNIT_ORDER the one run starts them in that order, each with its own extension's
    variables (a subninja per compile keeps the scope)."""
    layer = _layer_module()
    record = tmp_path / "record.txt"
    units = {"one": ["fps_cuda", "grid_cpu", "graclus_cuda"], "two": ["knn_cuda", "nearest_cuda.cu"]}
    folders = []
    for ext, names in units.items():
        folder = tmp_path / ext
        folder.mkdir()
        edges = "\n".join(f"build {folder}/csrc/{n}.o: compile {folder}/csrc/{n.removesuffix('.cu')}.cpp" for n in names)
        (folder / "build.ninja").write_text(EXTENSION_NINJA.format(ext=ext, record=record, edges=edges))
        (folder / "csrc").mkdir()
        for n in names:
            (folder / "csrc" / f"{n.removesuffix('.cu')}.cpp").write_text("")
        folders.append(str(folder))
    top = tmp_path / "top"
    top.mkdir()

    def run(order: list[str]) -> list[tuple[str, str]]:
        record.unlink(missing_ok=True)
        for f in tmp_path.glob("*/csrc/*.o"):
            f.unlink()
        layer.write_top_ninja(str(top), folders, order)
        subprocess.run(["ninja", "-j1", "-C", str(top)], check=True, capture_output=True)
        return [(Path(line.split()[0]).name, line.split()[1]) for line in record.read_text().splitlines()]

    assert run([]) == [("fps_cuda.o", "-DEXT=one"), ("grid_cpu.o", "-DEXT=one"), ("graclus_cuda.o", "-DEXT=one"),
                       ("knn_cuda.o", "-DEXT=two"), ("nearest_cuda.cu.o", "-DEXT=two")]
    assert run(["nearest_cuda", "graclus_cuda", "knn_cuda"]) == [
        ("nearest_cuda.cu.o", "-DEXT=two"), ("graclus_cuda.o", "-DEXT=one"), ("knn_cuda.o", "-DEXT=two"),
        ("fps_cuda.o", "-DEXT=one"), ("grid_cpu.o", "-DEXT=one")]
