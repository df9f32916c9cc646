"""argparse types for numeric and enumerated options: a bad value is a usage error (exit 2)
naming the option, never a traceback or a silently ignored value."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .errors import ExtforgeError

T = TypeVar("T")


def option_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """parse as an argparse type: its ExtforgeError or ValueError becomes argparse's usage error."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ExtforgeError as exc:
            raise argparse.ArgumentTypeError(" ".join(filter(None, (exc.what, exc.fix and f"({exc.fix})")))) from exc
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__  # argparse names the type in its message
    return convert


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"{text} is not a positive whole number")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text} is not a positive number")
    return value


def positive_size(parse: Callable[[str], int]) -> Callable[[str], int]:
    """A size parser that also refuses zero, nan and infinity."""

    def checked(text: str) -> int:
        value = parse(text)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{text} is not a positive size")
        return value

    checked.__name__ = parse.__name__
    return checked


def manylinux_policy(text: str) -> tuple[int, int]:
    """'2_28', '2.28' or 'manylinux_2_28' -> (2, 28): a site's target manylinux policy."""
    m = re.fullmatch(r"(?:manylinux_?)?(\d+)[._](\d+)", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a manylinux policy: write it like 2_28")
    return int(m.group(1)), int(m.group(2))


def add_wheel_index(group: argparse._ActionsContainer, what: str) -> None:
    """`--wheels DIR`: one option for `extforge publish` and the Slurm jobs of `extforge build`."""
    group.add_argument("--wheels", type=Path, metavar="DIR",
                       help=f"{what} into the wheel index DIR, one PEP 503/691 index per torch row: "
                       "DIR/torch<X.Y.Z>-cu<NNN>/simple/<project>/ (pip install NAME --index-url file://DIR/torch.../simple)")
