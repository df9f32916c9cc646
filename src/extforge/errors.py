"""Errors a user can act on, and the exit codes the CLI maps them to."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# Exit codes mean the same for every subcommand: scripts (Slurm prologs, CI) branch on them.
EXIT_OK = 0
EXIT_FINDINGS = 1  # the command ran and found problems (audit errors, verify failures, stale lock)
EXIT_CANNOT_RUN = 2  # bad input or an environment the command could not work in
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (what a shell reports for SIGPIPE)


class ExtforgeError(Exception):
    """An error with what went wrong, why, and how to fix it.

    Every user-facing failure is one of these, so the CLI can print one paragraph
    instead of a traceback.
    """

    exit_code = EXIT_CANNOT_RUN

    def __init__(self, what: str, why: str = "", fix: str = "", *, exit_code: int | None = None):
        super().__init__(what)
        self.what = what
        self.why = why
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def render(self) -> str:
        parts = [f"error: {self.what}"]
        if self.why:
            parts.append(f"  why: {self.why}")
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        return "\n".join(parts)

    def to_json(self) -> dict[str, str]:
        return {"error": self.what, "why": self.why, "fix": self.fix}


def file_system(path: str) -> tuple[str, int]:
    """The mount point holding path (or its nearest existing folder) and its free bytes."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    dev = here.stat().st_dev
    while here != here.parent and here.parent.stat().st_dev == dev:
        here = here.parent
    vfs = os.statvfs(here)
    return str(here), vfs.f_bavail * vfs.f_frsize


def _nearly_full(path: str) -> bool:
    try:
        return file_system(path)[1] < 16 * 2**20
    except OSError:
        return False


def from_os_error(exc: OSError) -> ExtforgeError | None:
    """The error a user can act on for an OSError any command may meet (a full disk, a name
    too long for the file system, a read-only mount); None for one that means a bug."""
    where = os.fsdecode(exc.filename) if exc.filename is not None else None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        quota = exc.errno == errno.EDQUOT
        if where is None and _nearly_full(tempfile.gettempdir()):
            where = tempfile.gettempdir()  # a scratch file (an archive being unpacked) names none
        if where is None:
            return ExtforgeError(
                f"no space left on a file system extforge writes to ({exc.strerror})",
                "the disk or your quota is full; what was being written is not kept",
                f"free space where the command writes, in its temporary folder ({tempfile.gettempdir()}) "
                "or in extforge's cache (`extforge cache --prune 14`), and run again",
            )
        try:
            mount, free = file_system(where)
        except OSError:
            mount, free = where, 0
        return ExtforgeError(
            f"no space left on the file system {mount} ({free // 2**20} MiB free{', your quota is used up' if quota else ''}) "
            f"while writing {where}",
            "what was being written is not kept (extforge writes through temporaries it removes), and what it "
            "was to replace is as it was",
            f"free space on {mount} (`df -h {mount}`; `extforge cache --prune 14` if extforge's cache is there) "
            "and run again",
        )
    if exc.errno == errno.ENAMETOOLONG:
        return ExtforgeError(
            f"a path is too long for its file system: {where or exc.strerror}",
            "a name in a path may have at most 255 bytes (and a path 4096)",
            "use shorter folder and file names",
        )
    if exc.errno == errno.EROFS:
        return ExtforgeError(f"cannot write {where or 'a file'}: the file system is mounted read-only", "",
                             "pass a folder on a writable file system")
    return None
