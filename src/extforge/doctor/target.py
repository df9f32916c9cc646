"""Facts about the target Python environment, read by running its own interpreter."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExtforgeError
from ..paths import scratch_dir
from .extensions import ExtensionSpec
from .model import ExtensionFacts, PythonFacts, TorchFacts
from .run import run_text

PROBE = Path(__file__).with_name("target_probe.py")
SENTINEL = "EXTFORGE-PROBE "


@dataclass(frozen=True)
class TargetFacts:
    python: PythonFacts
    torch: TorchFacts | None
    extensions: tuple[ExtensionFacts, ...]  # those installed of the ones asked for
    errors: dict[str, str]  # what could not be read, e.g. {"torch": "ModuleNotFoundError: ..."}


def parse_probe_output(stdout: str) -> TargetFacts:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(SENTINEL)), None)
    if line is None:
        raise ValueError("probe printed no result line")
    data: dict[str, Any] = json.loads(line[len(SENTINEL):])
    t = data.get("torch")
    return TargetFacts(
        python=PythonFacts(**data["python"]),
        torch=TorchFacts(**{**t, "arch_list": tuple(t.get("arch_list") or ())}) if t else None,
        extensions=tuple(ExtensionFacts(**{**e, "wheel_tags": tuple(e["wheel_tags"])}) for e in data.get("extensions", ())),
        errors=data.get("errors", {}),
    )


def probe_target(python: str, extensions: Sequence[ExtensionSpec] = (), timeout: float = 120) -> TargetFacts:
    # A neutral working directory: an extension's source checkout in the cwd would shadow the
    # installed package and make the installed one look broken.
    wanted = json.dumps([e.probe() for e in extensions])
    with scratch_dir("doctor") as cwd:
        out = run_text([python, "-c", PROBE.read_text(), wanted], timeout=timeout, cwd=str(cwd))
    if out is None or SENTINEL not in out.stdout:
        detail = (out.stderr.strip().splitlines() or ["no output"])[-1] if out else "it did not start or timed out"
        raise ExtforgeError(
            f"could not run the target python {python}",
            f"{detail}",
            "pass the environment's interpreter: extforge doctor --python /path/to/env/bin/python",
        )
    return parse_probe_output(out.stdout)
