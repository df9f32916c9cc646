"""The manylinux platform tag a wheel's binaries earn, decided by auditwheel's own policy data.

A wheel tagged `manylinux_2_N_<arch>` promises that it loads on any Linux with glibc 2.N and the
libstdc++/libgcc of that generation. What a binary needs is the versions its `.gnu.version_r`
requires (GLIBC_*, GLIBCXX_*, CXXABI_*, GCC_*, ...); which versions each policy allows is
auditwheel's `manylinux-policy.json`, read from the installed auditwheel, never a table of ours.
The rule is auditwheel's `versioned_symbols_policy`: the most compatible policy whose allowed
versions include, family by family, every version the binaries require.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..audit.glibc import version_key
from ..errors import ExtforgeError

# Wheel platform tags name the CPU as `uname -m` does; conda subdirs name it their own way.
ARCHES = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "linux-ppc64le": "ppc64le", "linux-s390x": "s390x",
          "linux-32": "i686", "linux-armv7l": "armv7l"}


@dataclass(frozen=True)
class Policy:
    name: str  # manylinux_2_28
    glibc: tuple[int, int]
    allowed: Mapping[str, frozenset[str]]  # family -> versions ("GLIBCXX" -> {"3.4", ..., "3.4.24"})
    libraries: frozenset[str]  # the system libraries a wheel of this policy may load from the OS

    def missing(self, needs: Iterable[Need]) -> list[Need]:
        """What `needs` asks of a family this policy knows beyond what it allows (auditwheel's rule)."""
        return [n for n in needs if n.family in self.allowed and n.number not in self.allowed[n.family]]


@dataclass(frozen=True)
class Need:
    """One symbol version a binary requires: `demo_ext/_C.so` needs GLIBCXX_3.4.30 from libstdc++.so.6."""

    module: str
    library: str
    version: str
    symbol: str = ""  # one symbol the module takes at that version (pthread_create)

    @property
    def family(self) -> str:
        return self.version.partition("_")[0]

    @property
    def number(self) -> str:
        return self.version.partition("_")[2]

    def describe(self) -> str:
        taken = f"{self.symbol}@{self.version}" if self.symbol else self.version
        return f"{self.module} needs {taken} (from {self.library})"


def needs_of(module: str, version_needs: Mapping[str, Sequence[str]],
             symbols: Iterable[tuple[str, str | None]] = ()) -> list[Need]:
    """The versioned requirements of one ELF file (`ElfObject.version_needs`), each with a symbol
    that takes it (`symbols`: its undefined (name, version) pairs); the dynamic loader's own are
    left out, as auditwheel leaves them."""
    example: dict[str, str] = {}
    for name, version in sorted(symbols):
        if version:
            example.setdefault(version, name)
    return [Need(module, lib, v, example.get(v, "")) for lib, versions in version_needs.items()
            if not (lib.startswith("ld-linux") or lib in ("ld64.so.1", "ld64.so.2")) for v in versions]


def policy_file() -> Path:
    """auditwheel's manylinux-policy.json, found without importing auditwheel."""
    spec = importlib.util.find_spec("auditwheel")
    if spec is None or spec.origin is None:
        raise ExtforgeError("auditwheel is not installed", "the manylinux tag of a wheel is decided by auditwheel's policy data",
                            "install extforge with its dependencies (pip install extforge, or scripts/setup)")
    return Path(spec.origin).parent / "policy" / "manylinux-policy.json"


@functools.cache
def policies(arch: str) -> tuple[Policy, ...]:
    """auditwheel's manylinux policies for `arch`, most compatible (oldest glibc) first."""
    path = policy_file()
    try:
        entries = json.loads(path.read_text())
        found = []
        for entry in entries:
            m = re.fullmatch(r"manylinux_(\d+)_(\d+)", str(entry.get("name", "")))
            versions = entry.get("symbol_versions", {}).get(arch)
            if not m or not isinstance(versions, dict):
                continue  # "linux" (no promise) or a policy without this CPU
            found.append(Policy(
                entry["name"], (int(m.group(1)), int(m.group(2))),
                {str(family): frozenset(map(str, vs)) for family, vs in versions.items()},
                frozenset(map(str, entry.get("lib_whitelist", [])))))
    except (OSError, ValueError, AttributeError, TypeError, KeyError) as exc:
        raise ExtforgeError(f"cannot read auditwheel's policy file {path}", str(exc),
                            "reinstall auditwheel (pip install --force-reinstall auditwheel)") from exc
    if not found:
        raise ExtforgeError(f"auditwheel's policy file {path} has no manylinux policy for {arch}", "",
                            "use an auditwheel release that knows this CPU")
    return tuple(sorted(found, key=lambda p: p.glibc))


def _too_new(policy: Policy, needs: Sequence[Need]) -> str:
    missing = policy.missing(needs)
    newest = max(missing, key=lambda n: (n.family, version_key(n.number)))
    allowed = policy.allowed.get(newest.family, frozenset())
    top = max(allowed, key=version_key) if allowed else "none"
    return f"{newest.describe()}, newer than {policy.name} allows ({newest.family} up to {top})"


def platform_tag(needs: Sequence[Need], arch: str, target: tuple[int, int] | None = None) -> str:
    """`manylinux_2_N_<arch>` of the most compatible policy that allows every need; refused
    (exit 1) when none does, or when it is newer than the site's `target`."""
    known = policies(arch)
    fitting = next((p for p in known if not p.missing(needs)), None)
    how = ("build it with an older compiler and sysroot (a manylinux_2_28 image's gcc-toolset, or an older "
           "distribution's gcc), so the binaries require older symbol versions")
    if fitting is None:
        raise ExtforgeError(f"no manylinux policy allows these binaries: {_too_new(known[-1], needs)}",
                            "a wheel tagged for a policy its binaries exceed fails to load on the nodes that policy promises",
                            how, exit_code=1)
    if target is not None and fitting.glibc > target:
        wanted = next((p for p in reversed(known) if p.glibc <= target), known[0])
        raise ExtforgeError(f"the wheel needs {fitting.name}, newer than the site's target manylinux_{target[0]}_{target[1]}: "
                            f"{_too_new(wanted, needs)}",
                            "the site's nodes are promised to load every wheel of its index",
                            f"{how}; or raise --manylinux if every node has glibc {fitting.glibc[0]}.{fitting.glibc[1]} "
                            "and its libstdc++", exit_code=1)
    return f"{fitting.name}_{arch}"
