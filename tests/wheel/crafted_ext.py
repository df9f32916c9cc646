"""Small conda packages of a real extension module (compiled by g++ here) and a torch environment
in pip's layout, so a wheel's making is tested in seconds; tests/wheel/test_wheel_clients.py does
the same with demo-ext's real build and real pip, uv and auditwheel."""

from __future__ import annotations

import json
from pathlib import Path

from security.crafted import Member, craft_package, gxx_so, member

SITE = "lib/python3.11/site-packages"
MODULE = "_C.cpython-311-x86_64-linux-gnu.so"
TORCH_PIN = "pytorch ==2.14.1 cuda130_py311_h08523a5_0"
DEPENDS = ["python", TORCH_PIN, "cuda-version >=13.0,<14.0a0", "python_abi 3.11.* *_cp311", "einops >=0.6", "__glibc >=2.17"]
PLAIN = 'extern "C" int f(int x) { return x + 1; }\n'
# pthread_create moved into libc in glibc 2.34: a module calling it needs GLIBC_2.34.
THREADS = '#include <pthread.h>\nextern "C" int f() { pthread_t t; return pthread_create(&t, 0, 0, 0); }\n'
METADATA = (b"Metadata-Version: 2.1\nName: demo-x\nVersion: 1.0\nSummary: a crafted extension\nRequires-Dist: torch\n"
            b"Provides-Extra: test\nRequires-Dist: pytest; extra == \"test\"\n\nThe long description.\n")


def torch_env(tmp: Path, version: str = "2.14.1+cu130") -> Path:
    """A prefix holding torch's and CUDA's libraries where pip's torch keeps them, and its version.py."""
    site = tmp / "torch-env" / SITE
    gxx_so(site / "torch" / "lib", "libc10.so")
    gxx_so(site / "nvidia" / "cu13" / "lib", "libcudart.so.13")
    cuda = version.partition("+cu")[2]
    (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda: str = '{cuda[:-1]}.{cuda[-1]}'\n")
    return tmp / "torch-env"


def extension(tmp: Path, env: Path, source: str = PLAIN, name: str = MODULE, *libs: str) -> bytes:
    """A module linked against the env's libc10.so and libcudart.so.13 (and `libs`: -l names), with
    the RPATH a conda package's module has."""
    site = env / SITE
    links = [f"-L{site}/torch/lib", f"-L{site}/nvidia/cu13/lib", "-Wl,--no-as-needed", "-l:libc10.so", "-l:libcudart.so.13",
             *libs, "-Wl,-rpath,$ORIGIN/../../..", "-Wl,--disable-new-dtags"]
    return gxx_so(tmp / "ext", name, source, *links).read_bytes()


def stamp(verdict: str = "pass") -> bytes:
    return json.dumps({"schema": 1, "name": "demo-x", "version": "1.0", "cxx11_abi": True, "verdict": verdict}).encode()


def torch_package(dest: Path) -> Path:
    """The pytorch package TORCH_PIN names, holding only torch's and CUDA's libraries where pip keeps them."""
    libs = [gxx_so(dest / "build" / "torch", "libc10.so"), gxx_so(dest / "build" / "nvidia", "libcudart.so.13")]
    members = [member(f"{SITE}/torch/lib/libc10.so", libs[0].read_bytes(), 0o755),
               member(f"{SITE}/nvidia/cu13/lib/libcudart.so.13", libs[1].read_bytes(), 0o755)]
    return craft_package(dest / "linux-64", "pytorch", members, version="2.14.1", build="cuda130_py311_h08523a5_0",
                         subdir="linux-64")


def extension_package(dest: Path, module: bytes, *, depends: list[str] = DEPENDS, audit: bytes | None = None,
                      module_name: str = MODULE, extra: list[Member] = (),  # type: ignore[assignment]
                      version: str = "1.0", site: str = SITE, egg_info: bool = False) -> Path:
    """demo-x as a build's `pip install .` leaves it in `site` (a Debian python's pip:
    local/lib/python3.11/dist-packages), with its audit stamp; `egg_info`: as a pip older than
    23.1 without `wheel` installs it (setup.py install)."""
    info = ([member(f"{site}/demo_x-1.0-py3.11.egg-info/{name}", data) for name, data in (
                ("PKG-INFO", METADATA), ("SOURCES.txt", b"setup.py\n"), ("installed-files.txt", b"../demo_x/__init__.py\n"),
                ("dependency_links.txt", b"\n"), ("top_level.txt", b"demo_x\n"))]
            if egg_info else
            [member(f"{site}/demo_x-1.0.dist-info/{name}", data) for name, data in (
                ("METADATA", METADATA), ("RECORD", b"demo_x/__init__.py,,\n"), ("INSTALLER", b"pip\n"),
                ("direct_url.json", b'{"url": "file:///build/work"}'), ("top_level.txt", b"demo_x\n"))])
    members = [
        member(f"{site}/demo_x/__init__.py", b"from . import _C\n"),
        member(f"{site}/demo_x/{module_name}", module, 0o755),
        member(f"{site}/demo_x/__pycache__/__init__.cpython-311.pyc", b"\x00"),
        *info,
        member("share/extforge/audit/demo-x.json", stamp() if audit is None else audit),
        *extra,
    ]
    return craft_package(dest, "demo-x", members, version=version, build="cuda130_torch214_py311_cxx11_h1234567_0",
                         subdir="linux-64", index={"depends": depends})
