"""Shared by the bench scripts: append one dated section to docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def append_section(lines: list[str]) -> None:
    with BENCHMARKS.open("a") as fh:
        fh.write("\n".join(lines) + "\n\n")
