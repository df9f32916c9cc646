"""Errors a user can act on, and the exit codes the CLI maps them to."""

from __future__ import annotations

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
