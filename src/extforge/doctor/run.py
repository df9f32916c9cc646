"""Run a probe command and keep its text; a probe that cannot run is a fact, never a crash."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Output:
    returncode: int
    stdout: str
    stderr: str


def run_text(
    argv: Sequence[str],
    *,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 20,
    cwd: str | None = None,
) -> Output | None:
    """The command's output, or None when it could not be started or did not finish in time."""
    try:
        proc = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout,
            cwd=cwd,
            errors="replace",
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Output(proc.returncode, proc.stdout, proc.stderr)
