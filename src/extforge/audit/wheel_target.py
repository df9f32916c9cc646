"""What a wheel says it is built for, held to the environment it is audited against.

A torch extension's wheel names its torch twice: `Requires-Dist: torch==X.Y.Z` (pip refuses it
beside another torch) and the local label of its version, upstream's convention
(`2.8.3+cu130torch2.11cxx11abiTRUE`: CUDA 13.0, torch 2.11, the new C++ ABI). Its tags name the
Python (`cp312`) and the oldest glibc it runs on (`manylinux_2_28`). The binary audit proves
what the modules need; these checks say, in the wheel's own words, which build the user should
have picked instead: a wheel for another torch fails with unresolved `c10::`/`at::` symbols at
import, and the fix is the wheel of the venv's torch row, not a rebuild.
"""

from __future__ import annotations

import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .report import Finding
from .resolve import TargetEnv

# PEP 600's legacy aliases of manylinux_2_N.
_LEGACY_GLIBC = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}
# A stable-ABI build serves a range of torch: its label names the toolkit (and ABI) alone, `+cu130`.
LABEL = re.compile(r"(?:cu(?P<cuda>\d+))?(?:torch(?P<torch>\d+\.\d+))?(?:cxx11abi(?P<abi>TRUE|FALSE))?", re.I)


def tag_glibc(tags: list[str]) -> str | None:
    """The oldest glibc a wheel's platform tags promise to run on ('manylinux_2_28_x86_64' ->
    '2.28'); None for linux_* tags, which promise nothing."""
    floors = []
    for tag in tags:
        plat = tag.rsplit("-", 1)[-1]
        if m := re.match(r"manylinux_(\d+)_(\d+)_", plat):
            floors.append((int(m.group(1)), int(m.group(2))))
        elif (legacy := plat.split("_", 1)[0]) in _LEGACY_GLIBC:
            major, minor = _LEGACY_GLIBC[legacy].split(".")
            floors.append((int(major), int(minor)))
    return f"{min(floors)[0]}.{min(floors)[1]}" if floors else None


def _release(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _built_for(version: str | None, requires: list[str]) -> tuple[str | None, str | None, dict[str, str]]:
    """(the torch requirement, the evidence in words, the local label's parts) of a wheel."""
    spec = None
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and str(req.specifier) and not req.marker:
            spec = str(req.specifier)
    # The label as written (packaging lower-cases it): cxx11abiTRUE is upstream's spelling.
    local = version.partition("+")[2] if version and _release(version) else None
    label = LABEL.fullmatch(local) if local else None
    parts = {k: v for k, v in (label.groupdict() if label else {}).items() if v}
    said = [f"Requires-Dist: torch{spec}"] if spec else []
    said += [f"version label +{local}"] if parts else []
    return spec, "; ".join(said) or None, parts


def wheel_findings(name: str | None, version: str | None, tags: list[str], requires: list[str], env: TargetEnv,
                   target_cxx11_abi: bool | None) -> list[Finding]:
    """A wheel's Python tag, torch pin, CUDA and C++ ABI label against the environment's."""
    findings = []
    pythons = {t.split("-")[0] for t in tags}
    if env.python and not any(_python_fits(t, env.python) for t in tags):
        findings.append(Finding(
            "error", "platform", f"{name} is built for {', '.join(sorted(pythons))}; the environment runs Python {env.python}",
            cause="an extension module is compiled for one CPython's ABI (pip would not install it there)",
            fix=f"install the wheel for cp{env.python.replace('.', '')}, or audit against an environment of that Python"))
    spec, said, label = _built_for(version, requires)
    have = _release(env.torch_version)
    if have is None or said is None:
        return findings
    wrong = []
    if spec is not None:
        from packaging.specifiers import SpecifierSet

        if not SpecifierSet(spec).contains(have, prereleases=True):
            wrong.append(f"torch{spec}")
    if "torch" in label and label["torch"] != f"{have.major}.{have.minor}":
        wrong.append(f"torch {label['torch']}")
    if wrong:
        findings.append(Finding(
            "error", "packaging", f"{name} {version} is built for another torch ({said}); the environment has torch {env.torch}",
            library="libtorch", cause="its compiled code calls torch's C++ API of that release: against this torch it "
                                     "fails at import with undefined c10::/at:: symbols (listed below when present)",
            fix=f"install the build of {name} for torch {have.public} (the wheel index of that torch row, e.g. "
                f".../torch{have.public}-cu{str(have.local or '').removeprefix('cu')}/simple), or give the environment "
                f"the torch it was built for: pip install 'torch{spec or '==' + label['torch'] + '.*'}'"))
    cuda = _release(env.cuda_version)
    if "cuda" in label and cuda is not None:
        digits = label["cuda"]
        built = Version(f"{digits[:-1]}.{digits[-1]}") if len(digits) > 1 else Version(digits)
        if built.major != cuda.major or (len(digits) > 2 and built.minor > cuda.minor):
            findings.append(Finding(
                "error", "packaging", f"{name} {version} is built with CUDA {built} (label cu{digits}); the environment's "
                                      f"torch uses CUDA {env.cuda_version}",
                cause="code built by one CUDA major does not load with another's runtime; a newer minor than torch's "
                      "may need symbols torch's runtime lacks",
                fix=f"install the build for this torch's CUDA ({env.torch}), from the wheel index of its torch row"))
    if "abi" in label and target_cxx11_abi is not None and (label["abi"].upper() == "TRUE") != target_cxx11_abi:
        findings.append(Finding(
            "error", "abi", f"{name} {version} says cxx11abi{label['abi'].upper()}; the environment's torch uses "
                            f"_GLIBCXX_USE_CXX11_ABI={int(target_cxx11_abi)}",
            cause="the module and torch disagree on std::string's layout and mangling",
            fix=f"install the cxx11abi{str(target_cxx11_abi).upper()} build for this torch"))
    return findings


def _python_fits(tag: str, python: str) -> bool:
    """Whether a wheel tag (python-abi-platform) installs on CPython `python` ("3.12"): cpXY for
    that Python, cp3Y-abi3 for 3.Y and later, py3."""
    interpreter, abi = tag.split("-")[:2]
    major, minor = python.split(".")[:2]
    if interpreter.startswith("py"):
        return interpreter[2:3] == major
    if m := re.fullmatch(r"cp(\d)(\d+)", interpreter):
        built = int(m.group(2))
        return m.group(1) == major and (built <= int(minor) if abi == "abi3" else built == int(minor))
    return True
