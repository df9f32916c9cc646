"""TORCH_CUDA_ARCH_LIST ("8.0;9.0", "8.0 9.0+PTX", "9.0a") as the build needs it: prints
`GENCODES NAMES CMAKE` — nvcc's -gencode values joined by ';', the code the package must then
carry (sm_90 for SASS, compute_90 for PTX) joined by ',', and CMake's CUDAARCHS ("90-real;90").
Named archs ("Hopper") are refused: a package's build string and audit need numbers."""

from __future__ import annotations

import re
import sys

ENTRY = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def parse(value: str) -> tuple[list[str], list[str], list[str]]:
    gencodes: list[str] = []
    names: list[str] = []
    cmake: list[str] = []
    for entry in filter(None, re.split(r"[;\s,]+", value.strip())):
        m = ENTRY.match(entry)
        if not m:
            raise ValueError(entry)
        cc = f"{m[1]}{m[2]}{m[3]}"
        gencodes.append(f"arch=compute_{cc},code=sm_{cc}")
        names.append(f"sm_{cc}")
        if m[4]:
            gencodes.append(f"arch=compute_{cc},code=compute_{cc}")
            names.append(f"compute_{cc}")
        cmake.append(cc if m[4] else f"{cc}-real")
    if not gencodes:
        raise ValueError(value)
    return gencodes, names, cmake


def main(argv: list[str]) -> int:
    try:
        gencodes, names, cmake = parse(argv[1] if len(argv) > 1 else "")
    except ValueError as exc:
        print(f"error: {exc} is not a compute capability like 9.0, 9.0a or 9.0+PTX", file=sys.stderr)
        return 1
    print(";".join(gencodes), ",".join(names), ";".join(cmake))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
