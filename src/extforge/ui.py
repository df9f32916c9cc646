"""Console output: quiet by default, -v for detail, progress on long work, JSON for machines.

Human output goes to stderr through rich so stdout stays clean for `--json`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

# Lines are never broken by rich: piped through `tee` or into a file it would wrap at 80 columns
# inside paths and package names, and a copied path would be broken; a terminal wraps long
# lines itself and copies them whole.
console = Console(stderr=True, highlight=False, soft_wrap=True)
if not console.is_terminal:
    console.width = 4096  # tables (status, verify --slurm) keep their natural width: no cell wraps
log = logging.getLogger("extforge")


class PlainHandler(logging.Handler):
    """Log records as one unwrapped line each (`warning: ...`), for output that is not a terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a bad format argument must not take the command down
            self.handleError(record)
            return
        prefix = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        console.print(prefix + line, markup=False, highlight=False, soft_wrap=True)


def setup_logging(verbosity: int) -> None:
    """0 = warnings and step lines only, 1 = info (-v), 2+ = debug (-vv)."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = (RichHandler(console=console, show_time=False, show_path=False, markup=False)
               if console.is_terminal else PlainHandler())
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s", force=True)
    log.setLevel(level)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (the only thing a `--json` run prints there)."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


@contextmanager
def step(title: str, *, quiet: bool = False) -> Iterator[dict[str, float]]:
    """Print one line per pipeline step with its duration; yields a dict that receives `seconds`."""
    timing: dict[str, float] = {}
    start = time.monotonic()
    if not quiet:
        console.print(f"[bold]→[/bold] {title} …")
    try:
        yield timing
    except BaseException as exc:
        timing["seconds"] = time.monotonic() - start
        if not quiet:
            # A stop signal's error exits 128 + the signal: the step was stopped, it did not fail.
            verb = "stopped" if getattr(exc, "exit_code", 0) > 128 or isinstance(exc, KeyboardInterrupt) else "failed"
            console.print(f"[red]✗[/red] {title} {verb} after {timing['seconds']:.1f} s")
        raise
    timing["seconds"] = time.monotonic() - start
    if not quiet:
        console.print(f"[green]✓[/green] {title} ({timing['seconds']:.1f} s)")


def progress(transient: bool = True) -> Progress:
    """A progress display for long loops (mirroring packages, auditing many files)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
        disable=not console.is_terminal,
    )
