"""Shared by the bench scripts: append one dated section to docs/benchmarks-history.md."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks-history.md"


def append_section(lines: list[str]) -> None:
    # A section starts after a blank line whatever the file ended with (a hand edit, a trimmed end).
    ends = BENCHMARKS.read_text()[-2:] if BENCHMARKS.exists() else "\n\n"
    lead = "" if ends == "\n\n" else ("\n" if ends.endswith("\n") else "\n\n")
    with BENCHMARKS.open("a") as fh:
        fh.write(lead + "\n".join(lines) + "\n\n")
