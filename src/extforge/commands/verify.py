"""extforge verify: is this environment intact and can this node run it?"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..options import option_type, positive_int

HELP = ("verify an installed environment: packages vs lock, every entry of the prefix accounted for (sha256, kind, "
        "link target, mode), node admission (driver, GPU archs, glibc); a pip/uv venv against its pylock.toml")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", type=Path, metavar="PREFIX", help="a prefix extforge installed, or a venv (pyvenv.cfg) "
                        "pip or uv installed from a pylock.toml (pass it as --lock)")
    parser.add_argument("--env", metavar="NAME", help="environment name in the lock (needed with --lock)")
    parser.add_argument("--lock", type=Path, help="compare installed packages with this pixi.lock (default: the lock of the "
                        "install record beside PREFIX, believed only when nobody but its owner and root can write it); "
                        "for a venv, the pylock.toml it was installed from")
    parser.add_argument("--threads", type=option_type(positive_int), help="hashing threads (default: 2 per core, at most 32)")
    parser.add_argument("--rehash", action="store_true",
                        help="hash every file, ignoring the record of files unchanged since the last clean run")
    from ..environment.mirrors import add_channel_map_option
    from ..slurm.options import add_verify_options

    add_channel_map_option(parser)
    add_verify_options(parser)
    parser.epilog = "exit code: 0 all checks pass or skip, 1 a check failed, 2 could not run"


def process_seconds() -> float | None:
    """Seconds since this process started (Linux): python start-up plus imports, at run()."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run(args: argparse.Namespace) -> int:
    if args.slurm:
        from ..slurm.cli import verify_slurm

        return verify_slurm(args)
    from ..environment.mirrors import site_mirrors
    from ..environment.venv import is_venv, verify_venv
    from ..environment.verify import verify_prefix
    from ..ui import console, emit_json

    # From the process start to here: the interpreter and every import verify needs.
    started = process_seconds()
    if is_venv(args.prefix):
        report = verify_venv(args.prefix, args.lock, threads=args.threads, rehash=args.rehash)
    else:
        # Packages installed through this site's mirror came from the lock's channels all the same.
        mirrors = site_mirrors(args.lock.resolve().parent if args.lock else None, None, args.channel_map)
        report = verify_prefix(args.prefix, lock_path=args.lock, env=args.env, threads=args.threads, rehash=args.rehash,
                               mirrors=mirrors)
    if started is not None:
        report.phases = {"python start-up and imports": started} | report.phases
    if args.json:
        emit_json(report.to_json())
    else:
        marks = {"pass": "[green]✓[/green]", "fail": "[red]✗[/red]", "skip": "[dim]-[/dim]"}
        for c in report.checks:
            console.print(f"{marks[c.verdict]} {c.name}: {c.summary}")
            for f in c.findings:
                console.print(f"    {f}", markup=False, soft_wrap=True)
        console.print(f"{'ok' if report.ok else 'FAILED'} ({report.seconds:.2f} s)")
        if args.verbose:
            for name, seconds in report.phases.items():
                console.print(f"  {seconds:7.3f} s  {name}", markup=False)
            console.print(f"  {report.files_hashed} files hashed, {report.files_unchanged} unchanged since the "
                          f"last clean run; record {report.snapshot}", markup=False)
    return report.exit_code
