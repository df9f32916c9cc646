"""Shared by the bench scripts: append one dated section to docs/benchmarks-history.md."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks-history.md"


def append_section(lines: list[str]) -> None:
    # A section starts after a blank line whatever the file ended with (a hand edit, a trimmed end).
    ends = BENCHMARKS.read_text()[-2:] if BENCHMARKS.exists() else "\n\n"
    lead = "" if ends == "\n\n" else ("\n" if ends.endswith("\n") else "\n\n")
    with BENCHMARKS.open("a") as fh:
        fh.write(lead + "\n".join(lines) + "\n\n")


def show(rows: list[str], row: str) -> None:
    """Print a table row as it is measured and keep it for record_table."""
    print(row, flush=True)
    rows.append(row)


def record_table(title: str, script: str, setting: str, columns: list[str], rows: list[str]) -> None:
    """Append a dated section: `title`, the machine, its CPUs, the commit measured and `setting`,
    then the table of `rows` (markdown lines) under `columns`."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=BENCHMARKS.parent).stdout.strip()
    append_section([
        f"## {title} ({dt.date.today()}, `bench/{script}`)",
        "",
        f"{platform.node()}, {os.cpu_count()} CPUs, commit {commit}; {setting}",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *rows,
    ])
