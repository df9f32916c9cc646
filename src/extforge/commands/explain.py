"""extforge explain: recognise a known failure in an error message or a build/import log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError

HELP = "recognise a known failure (undefined symbol, OOM kill, nvcc/driver mismatch, ...) in a message or log"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "text",
        nargs="?",
        help="the error message, or the path of a log file; '-' or nothing reads stdin",
    )
    parser.add_argument("--file", "-f", type=Path, help="read the log from this file (or a pipe such as <(cmd))")
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter of the environment that failed: its torch's CXX11 ABI tells an ABI mismatch from version skew",
    )
    parser.epilog = (
        "only the last 1 MiB of a log (file, pipe or stdin) is read and matched: a log file is seeked to its tail, "
        "a pipe is read to its end keeping only the tail; devices such as /dev/zero are refused. "
        "exit code: 0 recognised, 1 unknown text, 2 no input or unreadable file"
    )


def _read_input(args: argparse.Namespace) -> str:
    from ..doctor.explain import read_tail, stream_tail

    if args.file is not None:
        return read_tail(args.file)
    if args.text and args.text != "-":
        # A short argument that names a file is a log to read; anything else is the message itself.
        path = Path(args.text)
        if len(args.text) < 4096 and "\n" not in args.text and path.is_file():
            return read_tail(path)
        return args.text
    if args.text == "-" or not sys.stdin.isatty():
        return stream_tail(sys.stdin.buffer)
    raise ExtforgeError(
        "nothing to explain",
        "no message, --file or piped input was given",
        "extforge explain 'ImportError: ... undefined symbol: ...'  or  extforge explain build.log  or  cmd 2>&1 | extforge explain",
    )


def run(args: argparse.Namespace) -> int:
    from ..doctor.explain import explain_text
    from ..ui import console, emit_json

    text = _read_input(args)
    if not text.strip():
        raise ExtforgeError("nothing to explain", "the input is empty", "pass the error message, a log file, or pipe the failing command's output")
    torch_abi = None
    if args.python:
        from ..doctor.target import probe_target

        target = probe_target(args.python)
        torch_abi = target.torch.cxx11_abi if target.torch else None
    result = explain_text(text, torch_abi=torch_abi)
    if args.json:
        emit_json(result.to_json())
    else:
        console.print(result.render(), markup=False, soft_wrap=True)
    return EXIT_OK if result.recognised else EXIT_FINDINGS
