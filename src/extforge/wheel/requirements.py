"""A conda package's run requirements, said the way a wheel says them.

The conda package pins the exact pytorch build it was linked against; its wheel pins
`torch==X.Y.Z`, which PEP 440 lets match pip's `X.Y.Z+cu130` (a specifier without a local
label ignores the candidate's), so pip and uv refuse the wheel beside any other torch. The
version gets upstream's local label naming what the binary is tied to
(`0.1.0+cu130torch2.14cxx11abiTRUE`), and every other requirement its PyPI name
(`data/pypi-names.yaml`), dropping what a venv gets elsewhere (python, the C++ runtime, CUDA), each
with its reason there; a name the file does not know is refused, never guessed. A requirement on
another package extforge builds per torch (mamba-ssm's on causal-conv1d) becomes `==` the version
the wheel's own index row serves.
A package built on torch's stable C ABI (flash-attn-3: `pytorch >=2.9 cuda13*`) requires a
range, and its wheel the same range (`torch>=2.9`), labelled with its toolkit alone (`+cu130`):
the torch row it is served from keeps a torch of another CUDA away.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from ruamel.yaml import YAML

from ..errors import ExtforgeError

_DEP = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-]*)\s*(.*)")
_CONSTRAINT = re.compile(r"(==|!=|>=|<=|~=|>|<|=)?\s*([0-9A-Za-z_.+!*]+)")
_EXACT = re.compile(r"==?(\d+(?:\.\d+)*)")


DATA_FILE = "data/pypi-names.yaml"


@dataclass(frozen=True)
class PypiNames:
    """data/pypi-names.yaml: what each conda name of a run requirement is to a wheel."""

    rename: Mapping[str, str]  # conda name -> PyPI name
    same: frozenset[str]  # the same name on PyPI
    per_torch: frozenset[str]  # built by extforge for one torch: pinned to the wheel's own row
    drop: Mapping[str, str]  # name -> how a venv gets it without a requirement
    drop_prefix: Mapping[str, str]  # "__" -> why virtual packages need none

    def dropped(self, name: str) -> str | None:
        """Why a wheel needs no requirement on `name`; None where it does."""
        return self.drop.get(name) or next((why for p, why in self.drop_prefix.items() if name.startswith(p)), None)


@functools.cache
def pypi_names() -> PypiNames:
    data = YAML(typ="safe").load(resources.files("extforge").joinpath(DATA_FILE).read_text())
    return PypiNames(dict(data["rename"]), frozenset(data["same"]), frozenset(data["per_torch"]), dict(data["drop"]),
                     dict(data["drop_prefix"]))


@dataclass(frozen=True)
class Dropped:
    """A run requirement a venv meets another way, and how."""

    reason: str


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
    pins = [d for d in map(Dep.parse, depends) if pypi_names().rename.get(d.name) == "torch"]
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


def requires_dist(depends: Sequence[str], torch: Dep, package: str, row: str,
                  served: Mapping[str, Sequence[str]]) -> list[str]:
    """Requires-Dist lines: torch's (`==X.Y.Z`, or a stable-ABI build's range) first, then the
    other run requirements by PyPI name; `served`: the versions of each project (by PEP 503 name)
    the wheel index row `row` serves."""
    out = ["torch" + pep440(torch)]
    for dep in map(Dep.parse, depends):
        line = pypi_requirement(dep, package, row, served)
        if isinstance(line, str) and pypi_names().rename.get(dep.name) != "torch":
            out.append(line)
    return out


def pypi_requirement(dep: Dep, package: str, row: str, served: Mapping[str, Sequence[str]]) -> str | Dropped:
    """`dep` of `package` as a Requires-Dist line, or why the wheel drops it; refused (exit 1)
    where data/pypi-names.yaml does not know the name."""
    names = pypi_names()
    why = names.dropped(dep.name)
    if why:
        return Dropped(why)
    if dep.name in names.per_torch:
        return _served_pin(dep, package, row, served)
    pypi = names.rename.get(dep.name) or (dep.name if dep.name in names.same else None)
    if pypi is None:
        raise ExtforgeError(f"the run requirement {dep.name} of {package} has no known PyPI name",
                            "a wheel's Requires-Dist names PyPI projects, and a conda name may differ there (pytorch is torch) "
                            "or have no PyPI twin (a library pip's torch brings another way)",
                            f"add {dep.name} to extforge's {DATA_FILE}: under rename (its PyPI name), same, or drop "
                            "(with how a venv gets it)", exit_code=1)
    return pypi + pep440(dep)


def _served_pin(dep: Dep, package: str, row: str, served: Mapping[str, Sequence[str]]) -> str:
    """`name==X.Y.Z` of the newest version of `dep` the row serves; its local label left out, so
    that PEP 440 matches the row's `X.Y.Z+cu130torch2.14...` and nothing of another torch does."""
    spec = SpecifierSet(pep440(dep))
    versions = []
    for text in served.get(canonicalize_name(dep.name), ()):
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if spec.contains(version, prereleases=True):
            versions.append(version)
    if not versions:
        said = f"{dep.name} {dep.version}".strip()
        raise ExtforgeError(f"{package} requires {said}, and the wheel index row {row} serves no wheel of it",
                            f"{dep.name} is built for one torch: the wheel of {package} requires the version its own row "
                            "serves, never a build for another torch or PyPI's source",
                            f"publish the wheel of {dep.name} built for this torch into the row first, or in the same "
                            f"`extforge publish --wheels` as {package} (for `extforge build --wheel`: build {dep.name} "
                            "for this torch into a channel the build reads, such as its output folder)", exit_code=1)
    return f"{dep.name}=={max(versions).public}"


def built_for_rows(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """row -> project (PEP 503 name) -> versions, of the packages built per torch that channels hold
    (each by the exact torch it pins): what a build's wheels may require before any index serves
    them (`extforge build --wheel` of mamba-ssm beside the causal-conv1d built for its torch; the
    wheel index's publish keeps its own rule, the wheels it serves)."""
    names = pypi_names()
    out: dict[str, dict[str, list[str]]] = {}
    for record in records:
        name, version = record.get("name"), record.get("version")
        if name not in names.per_torch or not isinstance(version, str):
            continue
        try:
            pin = torch_pin([str(d) for d in record.get("depends") or ()], str(name))
        except ExtforgeError:
            continue
        out.setdefault(pin.row, {}).setdefault(canonicalize_name(str(name)), []).append(version)
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
