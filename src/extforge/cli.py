"""The `extforge` command line: one subcommand per concern, each in extforge.commands.<name>.

A command module provides:
    HELP: str                                  one line for `extforge --help`
    configure(parser: argparse.ArgumentParser) -> None
    run(args: argparse.Namespace) -> int       an exit code from extforge.errors
Command modules import their heavy dependencies (rattler, elftools) inside run(), so
`extforge verify` in a Slurm prolog does not pay for what it does not use.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import stat
import sys
import time
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from . import __version__, safe_files, ui
from .errors import EXIT_BROKEN_PIPE, EXIT_CANNOT_RUN, ExtforgeError, from_os_error
from .paths import cache_root, own_area
from .ui import emit_json, setup_logging

# Order is the order `extforge --help` lists them in: the pipeline first, diagnostics last.
COMMANDS = (
    "mirror",
    "recipe",
    "sources",
    "plan",
    "build",
    "audit",
    "publish",
    "lock",
    "install",
    "verify",
    "status",
    "doctor",
    "explain",
    "cache",
)


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"extforge.commands.{name}")


class UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse that raises its usage errors (a bad option, a missing argument) instead of
    exiting, so `--json` gets them as JSON on stdout like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def build_parser(available: Sequence[str] | None = None) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0, help="more detail (-vv for debug)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")

    parser: argparse.ArgumentParser = _Parser(
        prog="extforge",
        description="Build CUDA extensions for PyTorch as conda packages that match their torch, "
        "prove it with an audit, publish them to a channel and lock environments for every node.",
    )
    parser.add_argument("--version", action="version", version=f"extforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in available if available is not None else COMMANDS:
        try:
            module = _load(name)
        except ModuleNotFoundError as exc:
            if exc.name != f"extforge.commands.{name}":
                raise
            continue
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `extforge` program (argv None) or an in-process call with explicit arguments."""
    if argv is None:
        # SIGTERM (Slurm's time limit, kill) unwinds like Ctrl-C, so temporary folders are removed.
        signal.signal(signal.SIGTERM, _terminated)
    code = _run(list(sys.argv[1:] if argv is None else argv))
    if argv is None and "rattler" in sys.modules:
        _exit_skipping_finalization(code)
    return code


def _exit_skipping_finalization(code: int) -> None:
    """End the process without interpreter finalization.

    py-rattler's async calls (solve, install) run on a tokio runtime whose worker threads may
    still be finishing a task, dropping the Python objects it captured, when a quick command
    (a failed solve takes 0.1 s) reaches interpreter finalization; those threads then take
    the GIL of a finalizing interpreter and the process dies with SIGABRT/SIGSEGV ("Fatal
    Python error: PyGILState_Release") after its work and output are complete. Everything
    extforge writes is closed by then, so only the buffers are flushed here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run(argv: list[str]) -> int:
    # Only the named subcommand is imported and configured, keeping start-up small.
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser([first] if first in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        if "--json" in argv:
            emit_json({"error": f"bad arguments: {exc.message}", "why": "the command line does not match the command's options",
                       "fix": f"see `{exc.parser.prog} --help`"})
        return EXIT_CANNOT_RUN
    if not getattr(args, "_module", None):
        parser.print_help(sys.stderr)
        return EXIT_CANNOT_RUN
    setup_logging(args.verbose)
    try:
        return _dispatch(args, argv)
    except BrokenPipeError:
        # The reader went away (`extforge plan --json | head`), while the command ran or while its
        # error was written: nothing is wrong and nobody is left to tell. Later writes and the
        # flush at exit go to /dev/null instead of raising.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        return int(args._module.run(args))
    except ExtforgeError as exc:
        return _report(exc, args.json)
    except KeyboardInterrupt:
        ui.console.print("interrupted")
        return 130
    except BrokenPipeError:
        raise  # the reader went away: _run's to say, not a crash
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # a bug, or a Rust panic (pyo3's PanicException is a BaseException)
        if isinstance(exc, OSError) and (known := from_os_error(exc)) is not None:
            return _report(known, args.json)
        where = _crash_log(argv, exc)
        ui.console.print(f"error: extforge {args.command} failed unexpectedly: {type(exc).__name__}: {exc}; "
                      f"details in {where}", markup=False, soft_wrap=True)
        if args.json:
            emit_json({"error": f"{type(exc).__name__}: {exc}", "why": "unexpected failure", "fix": f"report it with {where}"})
        return EXIT_CANNOT_RUN


def _report(exc: ExtforgeError, as_json: bool) -> int:
    # stderr first: where stdout's reader went away, the person still reads why.
    ui.console.print(exc.render(), markup=False)
    if as_json:
        emit_json(exc.to_json())
    return exc.exit_code


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


CRASH_LOGS_KEPT = 20


def _crash_log(argv: Sequence[str], exc: BaseException) -> str:
    """Write the traceback to the cache's logs folder (own_area: this user's own in another
    user's cache root), private to this user (it names their paths), keeping the newest
    CRASH_LOGS_KEPT of this user's logs. The cache may be shared: a link planted at `logs` or at a
    log's name is refused, not written through, and what others put there (links, files named
    as logs of a later date) is neither counted nor removed."""
    try:
        logs = own_area("logs")
        root = cache_root()
        path = logs / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        safe_files.make_dirs(logs, beneath=root)
        text = f"extforge {__version__}: {' '.join(argv)}\n" + "".join(traceback.format_exception(exc))
        safe_files.write_atomic(path, text.encode(), mode=0o600, beneath=root)
        with safe_files.folder(logs, beneath=root) as dfd:
            mine = sorted(n for n in os.listdir(dfd) if n.startswith("crash-") and n.endswith(".log") and n != path.name
                          and _own_regular_file(n, dfd))
        for name in mine[:max(0, len(mine) + 1 - CRASH_LOGS_KEPT)]:
            safe_files.remove(logs / name, beneath=root)
    except (OSError, ExtforgeError) as err:
        return f"(no log: {err}; run with -vv)"
    return str(path)


def _own_regular_file(name: str, dfd: int) -> bool:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


if __name__ == "__main__":
    sys.exit(main())
