"""The one reader of files another user may write: a shared cost store, a recipe's data, the
notes and logs a build leaves in an output folder, anything under a cache or channel.

What is read there is input from whoever could write it, never code: every such read goes
through here and takes, in this order,
- a regular file only: opened with O_NOFOLLOW|O_NONBLOCK (a symbolic link, a FIFO or a device
  such as /dev/zero is refused at once, never waited on or read);
- at most `limit` bytes (a bigger file is refused from its size, a growing one after limit + 1);
- where the caller asks (`own`), the owner and mode policy of extforge's own state: this user's
  file, writable by nobody else (the rule install's private folder and the build layer's
  settings file follow);
- JSON nested at most MAX_DEPTH deep (json recurses per level: a 10,000-deep list was a
  RecursionError);
- typed, range-checked values: names of a fixed character set (UNIT_NAME: they reach shell
  scripts), finite numbers within bounds.
A refusal is `Refused`: one line naming the file, why, and what to do. tests/test_shared_reads.py
fails when a module of the planning and build path reads a file another way.

Public API: Refused, read_bytes, read_text, sha256, read_json, parse_json, shown, unit_name, integer, number, text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import TypeVar

from . import safe_files
from .errors import ExtforgeError
from .safe_files import Refused

T = TypeVar("T")

MAX_DEPTH = 32
# A translation unit's name as extforge passes it to its shell scripts (assignment.tsv, the
# launcher's notes, EXTFORGE_SPLIT_UNITS): a source file's stem, no character a shell treats
# apart; `@N` for its N-th compile by another command (unit_costs.NinjaEdge.unit).
UNIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}(@[0-9]{1,4})?")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A missing file stays FileNotFoundError; anything else that keeps it from being read is Refused."""
    try:
        yield
    except (FileNotFoundError, Refused):
        raise
    except ExtforgeError as exc:  # a folder below the anchor that is a link
        raise Refused(path, exc.what) from None
    except OSError as exc:
        raise Refused(path, exc.strerror or str(exc)) from None


def read_bytes(path: Path, *, limit: int, own: bool = False, beneath: Path | None = None, tail: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `limit` (safe_files.read_bytes); `own`: this
    user's, writable by nobody else; `beneath`: an anchor below which no folder is reached through
    a link; `tail`: the last `limit` bytes of a bigger file (a log), not a refusal. A missing file
    raises FileNotFoundError; anything else that keeps it from being read, Refused."""
    with _reading(path):
        return safe_files.read_bytes(path, limit=limit, beneath=beneath, own=own, tail=tail)


def sha256(path: Path, *, limit: int, beneath: Path | None = None) -> str:
    """The sha256 of the regular file `path`, streamed, read as read_bytes reads (at most `limit`
    bytes: a huge sparse file is refused from its size, a FIFO at once)."""
    with _reading(path):
        return safe_files.sha256(path, limit=limit, beneath=beneath)


def read_text(path: Path, *, limit: int, own: bool = False, beneath: Path | None = None, tail: bool = False) -> str:
    """read_bytes as text (undecodable bytes replaced: a log's torn last line is no failure)."""
    return read_bytes(path, limit=limit, own=own, beneath=beneath, tail=tail).decode(errors="replace")


def parse_json(text: str | bytes, where: str) -> object:
    """JSON nested at most MAX_DEPTH deep; ValueError (naming `where`) for anything else."""
    raw = text.decode(errors="replace") if isinstance(text, bytes) else text
    brackets = re.sub(r"[^\[\]{}]", "", _STRING.sub("", raw))
    if any(depth > MAX_DEPTH for depth in accumulate(1 if c in "[{" else -1 for c in brackets)):
        raise ValueError(f"{where}: JSON nested more than {MAX_DEPTH} deep")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None


def read_json(path: Path, parse: Callable[[object], T], *, limit: int, own: bool = False,
              beneath: Path | None = None) -> T:
    """`parse` (the typed, range-checked values) of the JSON file `path`: its ValueError,
    TypeError or KeyError becomes Refused naming the file."""
    data = read_bytes(path, limit=limit, own=own, beneath=beneath)
    try:
        return parse(parse_json(data, "its content"))
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(path, str(exc) if not isinstance(exc, KeyError) else f"it lacks {exc}") from None


def shown(value: object) -> str:
    """A value as a message may quote it: no terminal escape, no newline, at most 60 characters."""
    out = ascii(value)
    return out if len(out) <= 60 else out[:57] + "..."


def unit_name(value: object, where: str = "unit") -> str:
    """A translation unit's name, of UNIT_NAME's characters alone: it reaches shell scripts."""
    if not isinstance(value, str) or not UNIT_NAME.fullmatch(value):
        raise ValueError(f"{where} {shown(value)} is not a unit name (letters, digits and _.+- only, at most 200, and an @N)")
    return value


def integer(value: object, where: str, low: int, high: int) -> int:
    """A whole number (not a bool, not a float) in [low, high]."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{where} is {shown(value)}, not a whole number from {low} to {high}")
    return value


def number(value: object, where: str, low: float, high: float) -> float:
    """A finite number (not a bool) in [low, high]."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{where} is {shown(value)}, not a number from {low:g} to {high:g}")
    return float(value)


def text(value: object, where: str, pattern: re.Pattern[str]) -> str:
    """A string matching `pattern` whole."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{where} {shown(value)} is not of the form {pattern.pattern}")
    return value
