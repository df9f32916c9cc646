"""What a command that prints only JSON imports before its work: not rich (20 ms of a warm
install's one second), whose console is made where something is printed for a human."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from extforge import ui
from extforge.cli import main  # noqa: F401  (the program's own imports)
ui.setup_logging(0)
ui.emit_json({"ok": True})
print("rich imported" if any(m == "rich" or m.startswith("rich.") for m in sys.modules) else "rich not imported", file=sys.stderr)
ui.console.print("shown")  # the console, made at its first use
print("rich imported" if "rich.console" in sys.modules else "rich not imported", file=sys.stderr)
"""


def test_json_output_and_logging_setup_import_no_rich_where_stderr_is_no_terminal(tmp_path):
    """The old ui module made its rich console at import (and cli imported it): every command,
    `install --json` too, paid rich's import."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.strip().startswith("{")
    assert proc.stderr.splitlines() == ["rich not imported", "shown", "rich imported"], proc.stderr
