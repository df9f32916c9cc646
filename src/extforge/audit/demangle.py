"""Demangle C++ symbol names with c++filt, one subprocess per batch.

Demangling is for people: every check works on mangled names, so when c++filt is
missing or fails the mangled names are shown instead of failing the audit.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

_cache: dict[str, str] = {}


def demangle_all(names: Iterable[str]) -> dict[str, str]:
    """Mangled name -> demangled text (the name itself where it is not mangled C++)."""
    names = list(names)
    wanted = [n for n in dict.fromkeys(names) if n not in _cache]
    mangled = [n for n in wanted if n.startswith("_Z")]
    for n in wanted:
        _cache[n] = n
    tool = shutil.which("c++filt")
    if mangled and tool:
        try:
            out = subprocess.run(
                [tool], input="\n".join(mangled) + "\n", capture_output=True, text=True, check=True, timeout=120
            ).stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            out = []
        if len(out) == len(mangled):
            _cache.update(zip(mangled, out))
    return {n: _cache[n] for n in names}


def demangle(name: str) -> str:
    return demangle_all([name])[name]
