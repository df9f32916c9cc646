"""A conda package's run requirements, said the way a wheel says them.

The conda package pins the exact pytorch build it was linked against; its wheel pins
`torch==X.Y.Z`, which PEP 440 lets match pip's `X.Y.Z+cu130` (a specifier without a local
label ignores the candidate's), so pip and uv refuse the wheel beside any other torch. The
version gets upstream's local label naming what the binary is tied to
(`0.1.0+cu130torch2.14cxx11abiTRUE`), and every other requirement its PyPI name
(`data/pypi-names.yaml`), dropping what a venv gets elsewhere (python, the C++ runtime, CUDA).
A package built on torch's stable C ABI (flash-attn-3: `pytorch >=2.9 cuda13*`) requires a
range, and its wheel the same range (`torch>=2.9`), labelled with its toolkit alone (`+cu130`):
the torch row it is served from keeps a torch of another CUDA away.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from ruamel.yaml import YAML

from ..errors import ExtforgeError

_DEP = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-]*)\s*(.*)")
_CONSTRAINT = re.compile(r"(==|!=|>=|<=|~=|>|<|=)?\s*([0-9A-Za-z_.+!*]+)")
_EXACT = re.compile(r"==?(\d+(?:\.\d+)*)")


@functools.cache
def _names() -> dict[str, Any]:
    return YAML(typ="safe").load(resources.files("extforge").joinpath("data/pypi-names.yaml").read_text())


@dataclass(frozen=True)
class Dep:
    name: str
    version: str  # conda's version spec, "" for any
    build: str

    @classmethod
    def parse(cls, text: str) -> Dep:
        m = _DEP.fullmatch(text.strip())
        words = m.group(2).split() if m else []
        if not m or len(words) > 2 or "[" in text:
            raise ExtforgeError(f"cannot read the run requirement {text!r}", "a requirement is `name [version [build]]`",
                                "rebuild the package with rattler-build", exit_code=1)
        return cls(m.group(1).lower(), words[0] if words else "", words[1] if len(words) > 1 else "")


@dataclass(frozen=True)
class TorchPin:
    """The one torch a package was built for: its version and the CUDA of that torch build."""

    version: str  # 2.14.1
    cuda: str | None  # "130" (from the pin's build string cuda130_...); None: a CPU build

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def row(self) -> str:
        """The wheel index this package's wheel is served from, named as PyTorch names its own
        indexes: torch2.14.1-cu130 (torch2.6.0-cpu)."""
        return f"torch{self.version}-{f'cu{self.cuda}' if self.cuda else 'cpu'}"


def _refuse_pin(package: str, pins: Sequence[Dep]) -> ExtforgeError:
    said = ", ".join(f"{d.name} {d.version} {d.build}".strip() for d in pins) or "no pytorch requirement"
    return ExtforgeError(f"{package} pins no exact torch ({said})",
                         "its wheel is served from the index of one torch row and must refuse every other torch "
                         "(a range only for modules on the stable ABI, .abi3.so)",
                         "pin it in the recipe: run: ${{ pin_compatible('pytorch', exact=True) }}", exit_code=1)


def torch_dep(depends: Sequence[str], package: str) -> Dep:
    """The package's one requirement on pytorch with a version (an exact pin, or a stable-ABI
    build's range); refused (exit 1) without one."""
    pins = [d for d in map(Dep.parse, depends) if _names()["rename"].get(d.name) == "torch"]
    if len(pins) != 1 or not pep440(pins[0]):
        raise _refuse_pin(package, pins)
    return pins[0]


def exact_torch(dep: Dep) -> TorchPin | None:
    """The one torch an exact pin names; None for a range."""
    m = _EXACT.fullmatch(dep.version)
    cuda = re.match(r"cuda(\d+)_", dep.build)
    return TorchPin(m.group(1), cuda.group(1) if cuda else None) if m else None


def torch_pin(depends: Sequence[str], package: str) -> TorchPin:
    """The exact pytorch a package pins; refused (exit 1) without one: a wheel pins one torch."""
    dep = torch_dep(depends, package)
    pin = exact_torch(dep)
    if pin is None:
        raise _refuse_pin(package, [dep])
    return pin


def held_torch(words: str | None) -> TorchPin | None:
    """The torch an environment holds, as the audit reads it: a conda record's "2.11.0
    cuda130_py312_h1_0", or pip's torch/version.py "2.11.0+cu130"."""
    version, _, build = (words or "").partition(" ")
    release, _, local = version.partition("+")
    cuda = re.match(r"cuda(\d+)_", build) or re.fullmatch(r"cu(\d+)", local)
    return TorchPin(release, cuda.group(1) if cuda else None) if release else None


def pep440(dep: Dep) -> str:
    """conda's version spec of `dep` as a PEP 440 specifier ("" for any version)."""
    if dep.version in ("", "*"):
        return ""
    out = []
    for piece in dep.version.split(","):
        m = _CONSTRAINT.fullmatch(piece.strip())
        if not m or "|" in dep.version:
            raise ExtforgeError(f"the run requirement {dep.name} {dep.version} has no PyPI equivalent",
                                "a wheel's requirement is a PEP 440 specifier, which has no `|` and no conda-only forms",
                                f"write the recipe's requirement on {dep.name} as comparisons joined by commas", exit_code=1)
        op, version = m.group(1) or "==", m.group(2)
        if op == "=" or version.endswith("*"):  # conda's `=1.2` and `1.2*` mean any 1.2.x
            op, version = "==", version.rstrip("*").rstrip(".") + ".*"
        out.append(op + version)
    spec = ",".join(out)
    try:
        SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise ExtforgeError(f"the run requirement {dep.name} {dep.version} has no PyPI equivalent", str(exc),
                            f"write the recipe's requirement on {dep.name} as PEP 440 comparisons", exit_code=1) from exc
    return spec


def requires_dist(depends: Sequence[str], torch: Dep) -> list[str]:
    """Requires-Dist lines: torch's (`==X.Y.Z`, or a stable-ABI build's range) first, then the
    other run requirements by PyPI name."""
    names = _names()
    out = ["torch" + pep440(torch)]
    for dep in map(Dep.parse, depends):
        pypi = names["rename"].get(dep.name, dep.name)
        if pypi == "torch" or dep.name in names["drop"] or dep.name.startswith(names["drop_prefix"]):
            continue
        out.append(pypi + pep440(dep))
    return out


def cuda_toolkit(depends: Sequence[str], build_string: str) -> str | None:
    """The CUDA toolkit that compiled the package, "130": the `cuda-version >=13.0` its compiler
    exports, else its build string's `cuda130_`; None for a package no CUDA compiler built."""
    for dep in map(Dep.parse, depends):
        if dep.name == "cuda-version" and (m := re.match(r">=(\d+)\.(\d+)", dep.version)):
            return m.group(1) + m.group(2)
    m = re.match(r"cuda(\d+)_", build_string)
    return m.group(1) if m else None


def local_label(cuda: str | None, torch: TorchPin | None, cxx11_abi: bool | None) -> str:
    """flash-attn's convention, `cu128torch2.9cxx11abiTRUE`: the CUDA of the torch it pins (of the
    toolkit for a stable-ABI build, which serves a range), torch's major.minor (none for that
    range) and the C++ ABI the audit proved (left out where it proved none)."""
    abi = "" if cxx11_abi is None else f"cxx11abi{'TRUE' if cxx11_abi else 'FALSE'}"
    return f"{f'cu{cuda}' if cuda else ''}{f'torch{torch.minor}' if torch else ''}{abi}"
