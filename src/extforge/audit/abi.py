"""Which libstdc++ string ABI (_GLIBCXX_USE_CXX11_ABI) a binary was compiled with.

With ABI 1, std::string is std::__cxx11::basic_string (mangled `NSt7__cxx11...`) and
functions returning one carry the `B5cxx11` tag; with ABI 0 it is the old COW string,
mangled as the `Ss` abbreviation or an unscoped `Sb` basic_string. Mangled text alone
cannot tell `Ss` from a name that happens to contain those letters, so old-ABI
candidates are confirmed on their demangled form.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .demangle import demangle_all

CXX11_MARKERS = ("NSt7__cxx11", "B5cxx11", "St7__cxx11")
OLD_DEMANGLED = ("std::string", "std::basic_string<", "std::basic_stringstream<", "std::basic_ostringstream<",
                 "std::basic_istringstream<")
# Enough evidence to decide; decoding all of libtorch's names would only cost time.
MAX_OLD_CANDIDATES = 2000


@dataclass
class AbiEvidence:
    cxx11: list[str] = field(default_factory=list)  # mangled names using the CXX11 ABI
    old: list[str] = field(default_factory=list)  # mangled names using the pre-CXX11 string

    @property
    def cxx11_abi(self) -> bool | None:
        """True/False when the evidence is one-sided, None when neutral or mixed."""
        if self.cxx11 and not self.old:
            return True
        if self.old and not self.cxx11:
            return False
        return None

    @property
    def mixed(self) -> bool:
        return bool(self.cxx11 and self.old)


def uses_old_string(demangled: str) -> bool:
    # The CXX11 ABI's string always demangles as std::__cxx11::basic_string, never std::string.
    return any(marker in demangled for marker in OLD_DEMANGLED)


def abi_evidence(names: Iterable[str]) -> AbiEvidence:
    ev = AbiEvidence()
    candidates: list[str] = []
    for name in names:
        if not name.startswith("_Z"):
            continue
        if any(m in name for m in CXX11_MARKERS):
            ev.cxx11.append(name)
        elif ("Ss" in name or "Sb" in name) and len(candidates) < MAX_OLD_CANDIDATES:
            candidates.append(name)
    if candidates:
        demangled = demangle_all(candidates)
        ev.old = [n for n in candidates if uses_old_string(demangled[n])]
    return ev
