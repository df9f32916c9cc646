#!/usr/bin/env python3
"""What a job start pays for `import torch` in an environment Python cannot write, with the
byte code its packages ship and without it.

An env installed by pixi or conda from packages without .pyc (pixi and conda compile only noarch
packages) has none; where the job's user cannot write the env (a team's env on NFS), Python
compiles every module it imports again at every start. The mirror's packages ship their .pyc,
as conda-forge's do. Both cases are timed in one installed env:
- shipped: the env's own .pyc (PYTHONDONTWRITEBYTECODE=1: nothing is written, as in a read-only env);
- none: PYTHONPYCACHEPREFIX pointed at an empty folder, so Python looks for .pyc only there,
  finds none, compiles every module, and writes nothing.

usage: bench/import_bytecode_bench.py PREFIX [--module torch] [--runs 3] [--no-record]
PREFIX: an env holding the module, e.g. the one `./scripts/demo` installs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import append_section

from extforge.machine import detect


def time_import(python: Path, module: str, env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run([str(python), "-c", f"import {module}"], env=env, check=True, capture_output=True)
    return time.monotonic() - start


def count_pyc(prefix: Path) -> int:
    return sum(1 for _ in (prefix / "lib").rglob("*.pyc"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--module", default="torch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to docs/benchmarks-history.md")
    args = parser.parse_args()
    python = args.prefix / "bin" / "python"
    if not python.exists():
        print(f"error: {python} does not exist\n  fix: give the prefix of an installed env", file=sys.stderr)
        return 2
    base = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    time_import(python, args.module, base)  # the files into the page cache, for both modes alike
    with tempfile.TemporaryDirectory() as empty:
        modes = {"shipped": base, "none": base | {"PYTHONPYCACHEPREFIX": empty}}
        seconds = {name: [time_import(python, args.module, env) for _ in range(args.runs)] for name, env in modes.items()}
        assert not any(Path(empty).iterdir()), "Python wrote byte code although told not to"
    median = {name: statistics.median(s) for name, s in seconds.items()}
    pyc = count_pyc(args.prefix)
    rows = [f"| {name} | {median[name]:.2f} | {', '.join(f'{s:.2f}' for s in seconds[name])} |" for name in modes]
    print(f"{pyc} .pyc in {args.prefix}")
    print("\n".join(rows))
    print(f"without shipped byte code: {median['none'] / median['shipped']:.1f}x the import time")
    if not args.no_record:
        m = detect()
        append_section([
            f"## `import {args.module}` in an env Python cannot write, with and without shipped byte code ({dt.date.today().isoformat()})\n",
            f"Machine: {m.cores} cores, {m.memory_gib:.0f} GiB, {platform.machine()}; load average {os.getloadavg()[0]:.1f}. "
            f"`bench/import_bytecode_bench.py` on an installed env ({pyc} .pyc in it), {args.runs} runs each, files in the "
            "page cache. \"none\" is what every job start pays where the env's packages ship no .pyc and the job cannot "
            "write the env.\n",
            "| byte code | median seconds | runs |",
            "|---|---|---|",
            *rows,
        ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
