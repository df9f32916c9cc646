"""Python distribution metadata → conda names and match specs (pure logic, no I/O).

A conda package has no "extras": when A requires B[x], A's conda package depends on B and on
what B requires under extra x, so the flattened graph installs the same files pip would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# Where conda-forge's name for a PyPI distribution is not the canonical PyPI name.
CONDA_NAME_EXCEPTIONS: dict[str, str] = {
    "torch": "pytorch",
    "huggingface-hub": "huggingface_hub",
    "typing-extensions": "typing_extensions",
}


def conda_name(dist_name: str) -> str:
    canonical = canonicalize_name(dist_name)
    return CONDA_NAME_EXCEPTIONS.get(canonical, canonical)


def conda_version(pep440: str) -> str:
    """The public part of a version: conda versions cannot carry a local label (`+cu130`)."""
    try:
        return Version(pep440).public
    except InvalidVersion:
        return pep440.split("+", 1)[0]


def python_pin(py_version: str) -> str:
    """`3.11` → `python >=3.11,<3.12.0a0`, the way conda-forge pins python for binary packages."""
    major, minor = (int(x) for x in py_version.split(".")[:2])
    return f"python >={major}.{minor},<{major}.{minor + 1}.0a0"


def python_abi_pin(py_version: str) -> str:
    major, minor = py_version.split(".")[:2]
    return f"python_abi {major}.{minor}.* *_cp{major}{minor}"


def marker_environment(py_version: str, py_full_version: str) -> dict[str, str]:
    """The PEP 508 marker values of a CPython on linux-64."""
    return {
        "implementation_name": "cpython",
        "implementation_version": py_full_version,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": py_full_version,
        "python_version": ".".join(py_version.split(".")[:2]),
        "sys_platform": "linux",
    }


@dataclass(frozen=True)
class Dependency:
    name: str  # canonical PyPI name
    specifier: str
    extras: frozenset[str] = frozenset()

    @property
    def conda_spec(self) -> str:
        return conda_match_spec(self.name, self.specifier)


def conda_match_spec(dist_name: str, specifier: str) -> str:
    """PEP 440 specifier → conda match spec; local labels dropped, `==1.*` kept as a glob."""
    parts = []
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        op = next((o for o in ("===", "==", "!=", "~=", ">=", "<=", ">", "<") if clause.startswith(o)), "")
        version = clause[len(op) :].strip().split("+", 1)[0]
        if op == "===":
            op = "=="
        if op == "~=":
            # ~=X.Y.Z means >=X.Y.Z,==X.Y.*; written out because not every conda client reads ~=.
            pieces = version.split(".")
            parts += [f">={version}", f"{'.'.join(pieces[:-1])}.*" if len(pieces) > 1 else ""]
            continue
        if op == "==" and version.endswith(".*"):
            op = ""
        parts.append(f"{op}{version}")
    spec = ",".join(p for p in parts if p)
    return f"{conda_name(dist_name)} {spec}".strip()


def requirements_for(
    requires_dist: Iterable[str], env: Mapping[str, str], extras: Iterable[str] = ()
) -> list[Dependency]:
    """The dependencies that apply on this platform, for the base install plus `extras`."""
    wanted = {""} | {canonicalize_name(e) for e in extras}
    out: dict[str, Dependency] = {}
    for line in requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not any(
            _marker_true(req.marker, {**env, "extra": extra}) for extra in wanted
        ):
            continue
        name = canonicalize_name(req.name)
        prev = out.get(name)
        extras_: frozenset[str] = frozenset(canonicalize_name(e) for e in req.extras)
        spec = str(req.specifier)
        if prev:
            spec = ",".join(s for s in (prev.specifier, spec) if s)
            extras_ |= prev.extras
        out[name] = Dependency(name, spec, extras_)
    return list(out.values())


def _marker_true(marker: Marker, env: Mapping[str, str]) -> bool:
    return marker.evaluate(dict(env))


@dataclass
class DistInfo:
    """What the closure needs to know of one distribution, wherever it comes from."""

    name: str  # canonical
    version: str
    requires_dist: list[str] = field(default_factory=list)


@dataclass
class Closure:
    order: list[str]  # canonical names, roots first
    depends: dict[str, list[Dependency]]  # flattened: extras of dependencies already folded in
    missing: dict[str, str]  # dependency name → who asked for it


def closure(roots: Iterable[str], dists: Mapping[str, DistInfo], env: Mapping[str, str]) -> Closure:
    """Walk Requires-Dist from `roots` through `dists` (keyed by canonical name)."""
    order: list[str] = []
    depends: dict[str, list[Dependency]] = {}
    missing: dict[str, str] = {}
    queue: list[str] = [canonicalize_name(r) for r in roots]
    while queue:
        name = queue.pop(0)
        if name in depends or name in missing:
            continue
        dist = dists.get(name)
        if dist is None:
            missing[name] = "requested"
            continue
        deps = requirements_for(dist.requires_dist, env)
        flat: dict[str, Dependency] = {d.name: d for d in deps}
        for dep in deps:
            target = dists.get(dep.name)
            if dep.extras and target is not None:
                for extra_dep in requirements_for(target.requires_dist, env, dep.extras):
                    flat.setdefault(extra_dep.name, extra_dep)
        for dep_name in list(flat):
            if dep_name not in dists:
                missing.setdefault(dep_name, name)
                del flat[dep_name]
            elif dep_name not in depends:
                queue.append(dep_name)
        depends[name] = list(flat.values())
        order.append(name)
    return Closure(order, depends, missing)
