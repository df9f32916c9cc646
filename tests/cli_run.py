"""The extforge CLI run as a user runs it: a subprocess of the tests' own Python, its output
captured as text."""

import subprocess
import sys
from typing import Any

EXTFORGE = (sys.executable, "-m", "extforge")


def run_extforge(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`extforge ARGS`; keyword arguments go to subprocess.run (timeout, env, input, ...)."""
    return subprocess.run([*EXTFORGE, *args], capture_output=True, text=True, **kwargs)
