"""The C++ standard the host environment's torch headers require, e.g. `c++20` for torch 2.14.

Imported by torch_facts.py (one import of torch for every fact a build needs); run alone with the
host python (`python torch_cxx_std.py [CXX]`), it prints the standard without importing torch.
torch states its floor in its headers, as a `__cplusplus` guard in front of an `#error`
(torch 2.14's ATen/ATen.h: `#if !defined(_MSC_VER) && __cplusplus < 202002L` /
`#error C++20 or later compatible compiler is required to use ATen.`). The highest such floor
is the answer, read without importing torch (seconds, and no GPU libraries loaded). A torch
whose headers state no floor is probed instead: `#include <ATen/ATen.h>` compiled by CXX with
each standard in turn, the first that compiles wins.

Standalone on purpose (the build env has no extforge); tests/recipe/test_select_sources.py
runs it on torch's real headers.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

# __cplusplus values of the standards a guard can name.
STANDARDS = {201103: "c++11", 201402: "c++14", 201703: "c++17", 202002: "c++20", 202302: "c++23"}
GUARD = re.compile(r"^\s*#\s*(?:el)?if\b[^\n]*__cplusplus\s*<\s*(?P<value>\d+)L?\b[^\n]*\n\s*#\s*error\b", re.M)
# Where an extension's includes start: ATen, c10 (what ATen includes first) and torch's own headers.
ENTRY_GLOBS = ("ATen/ATen.h", "ATen/core/*.h", "c10/macros/*.h", "c10/util/C++*.h", "torch/*.h")
PROBE_ORDER = ("c++17", "c++20", "c++23")


def torch_include() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise SystemExit("error: the host env's python has no torch; add pytorch to the recipe's host requirements")
    include = Path(spec.origin).parent / "include"
    if not (include / "ATen" / "ATen.h").is_file():
        raise SystemExit(f"error: {include} has no ATen/ATen.h; this torch ships no C++ headers and cannot build extensions")
    return include


def required_by_guards(include: Path) -> str | None:
    """The highest standard an `#error` guard of torch's entry headers demands; None if none does."""
    floors = [int(m["value"]) for pattern in ENTRY_GLOBS for header in sorted(include.glob(pattern))
              for m in GUARD.finditer(header.read_text(errors="replace"))]
    if not floors:
        return None
    floor = max(floors)
    known = [v for v in STANDARDS if v >= floor]
    if not known:
        raise SystemExit(f"error: torch's headers need __cplusplus >= {floor}, newer than any standard this "
                         f"script knows ({', '.join(STANDARDS.values())}); add it to torch_cxx_std.py")
    return STANDARDS[min(known)]


def probed(include: Path, cxx: str) -> str:
    """The oldest standard with which CXX compiles `#include <ATen/ATen.h>`."""
    errors = ""
    for std in PROBE_ORDER:
        proc = subprocess.run([cxx, f"-std={std}", "-fsyntax-only", "-x", "c++", "-I", str(include), "-"],
                              input="#include <ATen/ATen.h>\n", capture_output=True, text=True)
        if proc.returncode == 0:
            return std
        errors = proc.stderr
    raise SystemExit(f"error: {cxx} compiles torch's ATen/ATen.h with none of {', '.join(PROBE_ORDER)}; "
                     f"the last attempt said:\n{errors[-2000:]}")


def main(argv: list[str]) -> int:
    include = torch_include()
    print(required_by_guards(include) or probed(include, argv[1] if len(argv) > 1 else "c++"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
