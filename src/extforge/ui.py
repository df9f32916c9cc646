"""Console output: quiet by default, -v for detail, progress on long work, JSON for machines.

Human output goes to stderr through rich so stdout stays clean for `--json`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.text import Text

    # Made at its first use (the module's __getattr__): rich's import is 20 ms of a command that
    # prints nothing but JSON (a warm install takes 1 s).
    console: Console

# Colours (SGR) in a compiler's log: dropped, they only style the text.
_COLOUR = re.compile(r"\x1b\[[0-9;:]*m")
# Every other control character (C0 but newline and tab, DEL, C1, the bidirectional overrides),
# ESC starting a title, clipboard (OSC 52) or clear-screen sequence among them.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """text with its terminal controls shown instead of obeyed: colour sequences removed, every
    other control character written as its escape (`\\x1b`), newlines and tabs kept. What extforge
    prints comes partly from files others wrote (a build log, a package's name, a channel's file
    names), and a raw escape sequence there could retitle the terminal, write to the clipboard,
    clear the screen or rewrite a line already printed."""
    text = _COLOUR.sub("", text.replace("\r\n", "\n"))
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


class _PrintableFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def _make_console() -> Console:
    """A rich console on stderr that prints every string through `printable`: one place for all of it."""
    from rich.console import Console

    class _Console(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(printable(text), **kwargs)

    # Lines are never broken by rich: piped through `tee` or into a file it would wrap at 80 columns
    # inside paths and package names, and a copied path would be broken; a terminal wraps long
    # lines itself and copies them whole.
    made = _Console(stderr=True, highlight=False, soft_wrap=True)
    if not made.is_terminal:
        made.width = 4096  # tables (status, verify --slurm) keep their natural width: no cell wraps
    return made


def __getattr__(name: str) -> Any:
    if name == "console":
        made = globals()["console"] = _make_console()
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _console() -> Console:
    made: Console | None = globals().get("console")
    return made if made is not None else __getattr__("console")


def _stderr_is_terminal() -> bool:
    """The console's is_terminal, without making it where stderr is plainly no terminal (rich's
    TTY_COMPATIBLE and FORCE_COLOR unset, no tty): rich says the same there."""
    if "TTY_COMPATIBLE" not in os.environ and "FORCE_COLOR" not in os.environ:
        try:
            if not sys.stderr.isatty():
                return False
        except ValueError:  # a closed stream, as rich takes it
            return False
    return _console().is_terminal


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
        _console().print(prefix + line, markup=False, highlight=False, soft_wrap=True)


def setup_logging(verbosity: int) -> None:
    """0 = warnings and step lines only, 1 = info (-v), 2+ = debug (-vv)."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler: logging.Handler = PlainHandler()
    if _stderr_is_terminal():  # rich's handler and progress display: imported where a terminal shows them
        from rich.logging import RichHandler

        handler = RichHandler(console=_console(), show_time=False, show_path=False, markup=False)
    # RichHandler renders a record's text itself, past the console's render_str.
    handler.setFormatter(_PrintableFormatter("%(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
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
        _console().print(f"[bold]→[/bold] {title} …")
    try:
        yield timing
    except BaseException as exc:
        timing["seconds"] = time.monotonic() - start
        if not quiet:
            # A stop signal's error exits 128 + the signal: the step was stopped, it did not fail.
            verb = "stopped" if getattr(exc, "exit_code", 0) > 128 or isinstance(exc, KeyboardInterrupt) else "failed"
            _console().print(f"[red]✗[/red] {title} {verb} after {timing['seconds']:.1f} s")
        raise
    timing["seconds"] = time.monotonic() - start
    if not quiet:
        _console().print(f"[green]✓[/green] {title} ({timing['seconds']:.1f} s)")


def progress(transient: bool = True) -> Progress:
    """A progress display for long loops (mirroring packages, auditing many files)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=_console(),
        transient=transient,
        disable=not _console().is_terminal,
    )


class LiveLine:
    """One line saying where a long step stands: redrawn in place on a terminal; where stderr is
    no terminal (a log file, a CI job, a Slurm job's output), printed as a plain line when its
    `key` changes (a ninja run starting) and otherwise at most every `plain_every` seconds;
    nothing when `quiet` (--json)."""

    def __init__(self, title: str, *, quiet: bool = False, plain_every: float = 30.0):
        self.title, self.quiet, self.plain_every = title, quiet, plain_every
        self._bar: Progress | None = None
        self._task: Any = None
        self._key: object = None
        self._printed: float | None = None
        self._last = ""

    def __enter__(self) -> LiveLine:
        if not self.quiet and _console().is_terminal:
            self._bar = progress()
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def show(self, message: str, key: object = None) -> None:
        if self.quiet or message == self._last:
            return
        if self._bar is not None:
            # Redrawn at once: rattler-build holds the GIL while it builds, so the bar's own
            # refresh thread waits until it is done.
            self._bar.update(self._task, description=message[:100], refresh=True)
            self._last = message
            return
        now = time.monotonic()
        if self._printed is None or key != self._key or now - self._printed >= self.plain_every:
            _console().print(message, markup=False, highlight=False, soft_wrap=True)
            self._key, self._printed, self._last = key, now, message
