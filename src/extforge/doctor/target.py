"""Facts about the target Python environment, read by running its own interpreter."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExtforgeError
from ..paths import scratch_dir
from .model import FlashAttnFacts, PythonFacts, TorchFacts
from .run import run_text

PROBE = Path(__file__).with_name("target_probe.py")
SENTINEL = "EXTFORGE-PROBE "


@dataclass(frozen=True)
class TargetFacts:
    python: PythonFacts
    torch: TorchFacts | None
    flash_attn: FlashAttnFacts | None
    errors: dict[str, str]  # what could not be read, e.g. {"torch": "ModuleNotFoundError: ..."}


def parse_probe_output(stdout: str) -> TargetFacts:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(SENTINEL)), None)
    if line is None:
        raise ValueError("probe printed no result line")
    data: dict[str, Any] = json.loads(line[len(SENTINEL):])
    t, fa = data.get("torch"), data.get("flash_attn")
    return TargetFacts(
        python=PythonFacts(**data["python"]),
        torch=TorchFacts(**{**t, "arch_list": tuple(t.get("arch_list") or ())}) if t else None,
        flash_attn=FlashAttnFacts(**{**fa, "wheel_tags": tuple(fa["wheel_tags"])}) if fa else None,
        errors=data.get("errors", {}),
    )


def probe_target(python: str, timeout: float = 120) -> TargetFacts:
    # A neutral working directory: a flash-attention source checkout in the cwd would shadow
    # the installed package and make the installed one look broken.
    with scratch_dir("doctor") as cwd:
        out = run_text([python, "-c", PROBE.read_text()], timeout=timeout, cwd=str(cwd))
    if out is None or SENTINEL not in out.stdout:
        detail = (out.stderr.strip().splitlines() or ["no output"])[-1] if out else "it did not start or timed out"
        raise ExtforgeError(
            f"could not run the target python {python}",
            f"{detail}",
            "pass the environment's interpreter: extforge doctor --python /path/to/env/bin/python",
        )
    return parse_probe_output(out.stdout)
