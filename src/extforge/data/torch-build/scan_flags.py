"""Names, before the compile, the flags in upstream's build files that would override what the
variant says: GPU archs (-gencode/-arch/-code), nvcc threads, a C++ standard. Usage:
`scan_flags.py SRC_DIR MODE ARCH_NAMES`; MODE `rewrite` notes them (extforge-nvcc replaces them
at each compile), `within` too (extforge-nvcc drops them), `refuse` exits 1 on an arch that is not
the variant's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

FILES = ("setup.py", "CMakeLists.txt", "*.cmake", "build*.py", "cmake/*.cmake")
ARCH = re.compile(r"arch=compute_(\d+[af]?),\s*code=\[?((?:sm|compute)_\d+[af]?)|-arch[= ](sm_\d+[af]?)|--gpu-architecture[= ](\w+)")
THREADS = re.compile(r"""["']--threads["'],\s*["']?(\d+)|--threads[= ](\d+)""")
STD = re.compile(r"-std=(c\+\+\d+)")


def scan(src: Path, wanted: set[str]) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    foreign: list[str] = []
    for pattern in FILES:
        for path in sorted(src.glob(pattern)):
            if not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                where = f"{path.relative_to(src)}:{number}"
                for m in ARCH.finditer(line):
                    code = m[2] or m[3] or m[4] or ""
                    if code not in wanted:
                        foreign.append(f"{where}: {m[0].strip()}")
                for m in THREADS.finditer(line):
                    notes.append(f"{where}: nvcc --threads {m[1] or m[2]} (NVCC_THREADS wins)")
                for m in STD.finditer(line):
                    notes.append(f"{where}: -std={m[1]} (raised to torch's standard where lower)")
    return notes, foreign


def main(argv: list[str]) -> int:
    src, mode, names = Path(argv[1]), argv[2], set(argv[3].split(","))
    notes, foreign = scan(src, names)
    for line in foreign:
        verb = {"refuse": "refused", "within": "dropped at each compile, kept:"}.get(mode, "replaced at each compile by")
        print(f"extforge-torch-build: {line}: an arch outside the variant's, {verb} {','.join(sorted(names))}",
              file=sys.stderr)
    for line in notes:
        print(f"extforge-torch-build: {line}", file=sys.stderr)
    return 1 if foreign and mode == "refuse" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
