"""The log `extforge build` keeps of a build, told apart from the files kept beside it."""

from __future__ import annotations

from pathlib import Path


def build_log(out: Path, name: str) -> Path:
    """OUT/logs/NAME-<time>.log; beside it `.ninja_log`, `.units` and `.split.log` (the build layer's
    scan of the units, which the plain glob NAME-*.log matches too)."""
    (log,) = [p for p in (out / "logs").glob(f"{name}-*.log") if not p.name.endswith(".split.log")]
    return log
