"""Real wheels, a PEP 503 wheel index on disk, and the real pip and uv clients, for the tests of
pip users' locks (`extforge lock` writing pylock.toml) and checks (`extforge verify VENV`).

The wheels are built here by `pip wheel` from two tiny projects: a pure one, and one whose
extension module g++ compiles through setuptools and that requires the pure one. pip comes from
PyPI into a tools venv of its own (the version that installs `-r pylock.toml`); uv is
extforge's own dependency.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from extforge.locking import exclusive
from extforge.publishing.index import index_channel
from pip_clients import clean_client_env
from security.crafted import craft_package

PURE_SETUP = 'from setuptools import setup\nsetup(name="pip-pure", version="1.0", packages=["pip_pure"])\n'
EXT_SETUP = """from setuptools import Extension, setup
setup(name="pip-ext", version="{version}", install_requires=["pip-pure==1.0"], packages=["pip_ext"],
      ext_modules=[Extension("pip_ext._core", ["core.cpp"], language="c++")])
"""
EXT_SOURCE = r"""
#include <Python.h>
#include <string>
static PyObject* greet(PyObject*, PyObject* arg) {
  std::string who = PyUnicode_AsUTF8(arg);
  return PyUnicode_FromString(("hello " + who).c_str());
}
static PyMethodDef methods[] = {{"greet", greet, METH_O, ""}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", nullptr, -1, methods};
PyMODINIT_FUNC PyInit__core() { return PyModule_Create(&module); }
"""
EXT_VERSION = "1.0+cpu"
PIP_CLIENT = "pip>=26.3,<27"  # the first pip that installs `-r pylock.toml`


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_client_env(), **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def build_wheels(work: Path, dest: Path) -> list[Path]:
    """pip-pure 1.0 (py3-none-any) and pip-ext 1.0+cpu (cpXY, g++-compiled) into dest."""
    pure, ext = work / "pure", work / "ext"
    (pure / "pip_pure").mkdir(parents=True)
    (pure / "setup.py").write_text(PURE_SETUP)
    (pure / "pip_pure" / "__init__.py").write_text("VALUE = 42\n")
    (ext / "pip_ext").mkdir(parents=True)
    (ext / "setup.py").write_text(EXT_SETUP.format(version=EXT_VERSION))
    (ext / "pip_ext" / "__init__.py").write_text("from ._core import greet\n")
    (ext / "core.cpp").write_text(EXT_SOURCE)
    env = clean_client_env() | {"CC": "g++", "CXX": "g++"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest),
                    str(pure), str(ext)], check=True, capture_output=True, env=env)
    return sorted(dest.glob("*.whl"))


def write_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 simple index over the wheels (each link with its sha256); its file:// URL."""
    files = root / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        copy = files / wheel.name
        copy.write_bytes(wheel.read_bytes())
        projects.setdefault(wheel.name.split("-")[0].replace("_", "-"), []).append(copy)
    simple = root / "simple"
    simple.mkdir()
    (simple / "index.html").write_text("<!DOCTYPE html><html><body>"
                                       + "".join(f'<a href="{p}/">{p}</a>' for p in projects) + "</body></html>\n")
    for project, copies in projects.items():
        (simple / project).mkdir()
        links = "".join(f'<a href="../../files/{c.name.replace("+", "%2B")}#sha256={hashlib.sha256(c.read_bytes()).hexdigest()}">'
                        f"{c.name}</a>" for c in copies)
        (simple / project / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>\n")
    return simple.as_uri()


def python_channel(root: Path) -> Path:
    """A conda channel holding one `python` record of this interpreter's version: what an
    environment's PyPI packages are resolved for."""
    craft_package(root / "linux-64", "python", version=platform.python_version(), build="0", subdir="linux-64")
    index_channel(root)
    return root


MANIFEST = """[workspace]
name = "pip-users"
channels = ["{channel}"]
platforms = ["linux-64"]

[feature.node.dependencies]
python = "{python}.*"

[feature.node.pypi-dependencies]
pip-ext = "=={ext_version}"

[feature.node.pypi-options]
index-url = "{index}"

[environments]
node = {{ features = ["node"], no-default-feature = true }}
"""


@dataclass(frozen=True)
class PipSite:
    """A workspace whose `node` environment is marked for pip, its wheel index and channel."""

    workspace: Path
    index: str
    wheels: list[Path]
    pip: Path  # a python whose pip installs `-r pylock.toml`
    uv: str

    @property
    def manifest(self) -> Path:
        return self.workspace / "pixi.toml"

    @property
    def pylock(self) -> Path:
        return self.workspace / "pylock.node.toml"

    def venv(self, path: Path) -> Path:
        """A fresh venv of this interpreter, without pip (the clients install into it from outside)."""
        _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
        return path

    def pip_install(self, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.pip), "-m", "pip", "--python", str(venv / "bin" / "python"), "install", *args],
                              capture_output=True, text=True, env=clean_client_env())

    def uv_pip(self, command: str, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.uv, "pip", command, "--no-config", "--python", str(venv / "bin" / "python"), *args],
                              capture_output=True, text=True, env=clean_client_env())


def pip_client(fixtures_dir: Path) -> Path:
    """The python of a tools venv whose pip installs pylock.toml files, made once per checkout."""
    tools = fixtures_dir / "pip-client"
    with exclusive(fixtures_dir / "pip-client.lock"):
        python = tools / "bin" / "python"
        if not (tools / ".complete").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(tools)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", PIP_CLIENT], check=True)
            (tools / ".complete").touch()
    return python


@pytest.fixture(scope="session")
def pip_site(tmp_path_factory, fixtures_dir) -> PipSite:
    import uv

    root = tmp_path_factory.mktemp("pip-site")
    wheels = build_wheels(root / "src", root / "built")
    index = write_index(root / "wheels", wheels)
    channel = python_channel(root / "conda")
    workspace = root / "ws"
    workspace.mkdir()
    short = ".".join(platform.python_version().split(".")[:2])
    (workspace / "pixi.toml").write_text(MANIFEST.format(channel=channel.as_uri(), python=short, ext_version=EXT_VERSION,
                                                         index=index))
    return PipSite(workspace, index, wheels, pip_client(fixtures_dir), uv.find_uv_bin())
