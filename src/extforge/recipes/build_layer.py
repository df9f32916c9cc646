"""The build layer every torch extension recipe gets: the `extforge-torch-build` package.

A recipe lists `extforge-torch-build` in its build requirements (as a conda-forge recipe lists
its compilers); the package's activation script (data/torch-build/activate.sh) then applies
extforge's guarantees to whatever the recipe's script runs: no network, the variant's GPU archs
enforced on nvcc, torch's C++ ABI and standard, MAX_JOBS/NVCC_THREADS, the compile cache, a
build record. What `extforge build` decides for one variant (the planner's job counts, the
compile cache) reaches the activation through a settings file beside rattler-build's work
folders: rattler-build starts build scripts with a clean environment.

Public API: LAYER_PACKAGE, BUILD_STRING, variants_file(), layer_files(), switches(), switch_for(text),
uses_layer(text), builds_torch_extension(text), write_settings(output_dir, values).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from ruamel.yaml import YAML

from .. import safe_files

LAYER_PACKAGE = "extforge-torch-build"
SHARE = "share/extforge-torch-build"
# What a recipe of the layer inherits where it says nothing itself (`extforge build` fills them in):
# the build string, naming everything the binary is tied to: CUDA toolkit, torch, python and the
# C++ ABI (torch 2.6 exists with both; conda-forge's torch is always cxx11, hence the default),
# e.g. cuda130_torch214_py311_cxx11_h<hash>_0; and the variant file read before the recipe's own
# (VARIANTS: the GPU archs; with rattler-build alone, `-m $PREFIX/share/extforge-torch-build/variants.yaml`).
BUILD_STRING = ("cuda${{ cuda_compiler_version | version_to_buildstring }}_torch${{ pytorch | version_to_buildstring }}"
                "_py${{ python | version_to_buildstring }}_${{ cxx_abi | default(\"cxx11\") }}_h${{ hash }}_${{ build_number }}")
VARIANTS = "variants.yaml"
# Beside rattler-build's work folders (<its output folder>/bld/rattler-build_<name>_<time>, a
# folder of the builder's alone: building/build.py's work_folder): the activation reads
# $BUILD_DIR/../ this file.
SETTINGS_FILE = "extforge-build-settings.sh"


@dataclass(frozen=True)
class Switch:
    """An upstream setup.py's own switch between compiling and downloading a prebuilt wheel, and
    the one with which it picks the C++ ABI."""

    package: str
    wheel: str  # the wheel file name's start, as in the URL upstream guesses
    values: dict[str, str]
    cxx11_abi: str | None = None  # upstream's own C++ ABI switch, set as the host torch was built

    def assignment(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


def _data(name: str) -> str:
    return resources.files("extforge").joinpath(f"data/{name}").read_text(encoding="utf-8")


@cache
def switches() -> tuple[Switch, ...]:
    rows = YAML(typ="safe").load(_data("download-switches.yaml"))["switches"]
    return tuple(Switch(r["package"], r["wheel"], {str(k): str(v) for k, v in r["set"].items()}, r.get("cxx11_abi"))
                 for r in rows)


def switch_for(text: str) -> Switch | None:
    """The switch of the package whose wheel a download URL or log line names (longest name first:
    `flash_attn_3` before `flash_attn`)."""
    for sw in sorted(switches(), key=lambda s: -len(s.wheel)):
        if re.search(rf"(?<![\w]){re.escape(sw.wheel)}-\d", text):
            return sw
    return None


def switches_sh() -> str:
    lines = ["# Generated from extforge's download-switches.yaml: every known switch to build, not download."]
    lines += [f"export {k}={shlex.quote(v)}" for sw in switches() for k, v in sw.values.items()]
    abi = " ".join(sw.cxx11_abi for sw in switches() if sw.cxx11_abi)
    lines += ["# Upstream switches that pick the C++ ABI themselves: activate.sh sets them as the host torch was built.",
              f"_xf_abi_switches={shlex.quote(abi)}"]
    return "\n".join(lines) + "\n"


def variants_file() -> Path:
    """The variant file every recipe of the layer reads first (VARIANTS)."""
    return Path(str(resources.files("extforge").joinpath(f"data/torch-build/{VARIANTS}")))


def layer_files() -> list[tuple[str, str, str]]:
    """The package's files as (path in the prefix, content, octal mode)."""
    root = resources.files("extforge").joinpath("data/torch-build")
    out = [("etc/conda/activate.d/extforge-torch-build.sh", root.joinpath("activate.sh").read_text(), "644"),
           ("bin/extforge-nvcc", root.joinpath("extforge-nvcc").read_text(), "755"),
           (f"{SHARE}/switches.sh", switches_sh(), "644")]
    for name in ("in-build.sh", "cxx-wrapper.sh", "wrappers.sh", "torch_facts.sh", "torch_facts.py", "torch_cxx_std.py", "archs.py",
                 "scan_flags.py", "split_unit.py", "record.py", "python/sitecustomize.py", "python/extforge_build_ext.py",
                 VARIANTS):
        mode = "755" if name.endswith("-wrapper.sh") else "644"
        out.append((f"{SHARE}/{name}", root.joinpath(name).read_text(), mode))
    return out


LISTED = re.compile(rf"^\s*-\s*{re.escape(LAYER_PACKAGE)}\b", re.M)


def uses_layer(recipe_text: str) -> bool:
    """Whether a recipe lists the layer package (in its build requirements)."""
    return bool(LISTED.search(recipe_text))


def builds_torch_extension(recipe_text: str) -> bool:
    """Whether a recipe compiles CUDA against torch (the recipes the layer is for)."""
    return "compiler('cuda')" in recipe_text.replace('"', "'") and re.search(r"^\s*-\s*pytorch\b", recipe_text, re.M) is not None


def settings_text(values: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(values.items()))


def write_settings(output_dir: Path, values: Mapping[str, str]) -> Path:
    """The settings file the next build in `output_dir` reads (owner-only writable: the
    activation ignores one that someone else could have written)."""
    path = output_dir / "bld" / SETTINGS_FILE
    safe_files.make_dirs(path.parent, beneath=output_dir)
    safe_files.write_atomic(path, settings_text(values).encode(), mode=0o644, beneath=output_dir)
    return path
