"""`extforge explain` input modes, JSON and exit codes (0 recognised, 1 unknown, 2 no input)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cli_run import run_extforge

DATA = Path(__file__).with_name("data")
MESSAGE = "RuntimeError: CUDA error: no kernel image is available for execution on the device"


def explain(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_extforge("explain", *args, input=stdin, timeout=60)


def test_message_as_argument() -> None:
    out = explain(MESSAGE)
    assert out.returncode == 0 and out.stderr.startswith("no-kernel-image:") and out.stdout == ""


def test_log_as_path_as_file_option_and_on_stdin() -> None:
    log = DATA / "nvcc-too-old-prompt4driving-5.txt"
    for out in (explain(str(log)), explain("--file", str(log)), explain(stdin=log.read_text()), explain("-", stdin=log.read_text())):
        assert out.returncode == 0 and "nvcc-too-old" in out.stderr


def test_json() -> None:
    out = explain("--json", MESSAGE)
    doc = json.loads(out.stdout)
    assert doc["recognised"] is True and doc["diagnoses"][0]["id"] == "no-kernel-image"


def test_unknown_text() -> None:
    out = explain("--json", "Segmentation fault (core dumped)")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["recognised"] is False and "extforge doctor" in doc["advice"]
    assert explain("Segmentation fault").stderr.startswith("unknown:")


def test_no_input_and_missing_file() -> None:
    empty = explain(stdin="")  # empty stdin is no input: exit 2, as the help says
    assert empty.returncode == 2 and "nothing to explain" in empty.stderr
    missing = explain("--file", "/nonexistent/build.log")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
