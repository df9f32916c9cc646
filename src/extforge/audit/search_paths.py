"""The library search paths a module carries (DT_RPATH, DT_RUNPATH, DT_NEEDED by path), judged
by where they lead on the user's node, not on the machine running the audit.

Only two kinds of entry are vouched for: `$ORIGIN`-relative ones that stay inside the prefix
(the loader expands `$ORIGIN` to the module's own folder, wherever the environment lives) and
absolute ones inside the prefix. Everything else names a folder whose contents the package
does not control: an absolute build folder (`/home/builder/torch/lib`: on a node it holds
nothing, or someone else's libraries; on the build machine it holds the build's own, which
would make an audit there pass), a relative path or an empty entry (the loader takes those
from the working directory of whoever starts python), or a world-writable folder (any user
plants a library there).
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .report import Finding, Severity
from .resolve import SYSTEM_DIRS

# World-writable on every Linux node, whatever the auditing machine has.
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock")
_ORIGIN = ("$ORIGIN", "${ORIGIN}")
# Substituted by the loader; any value does for telling where an entry leads.
_TOKENS = {"${LIB}": "lib", "$LIB": "lib", "${PLATFORM}": "platform", "$PLATFORM": "platform"}

VERDICTS: dict[str, tuple[Severity, str, str]] = {
    # verdict: (severity, what it is, why it matters)
    "cwd": ("error", "relative to the working directory",
            "the loader searches it from the folder python was started in: whoever controls that folder "
            "supplies the module's libraries"),
    "escapes": ("error", "a $ORIGIN path leading outside the prefix",
                "it names a folder beside the environment, which the package does not control"),
    "world-writable": ("error", "a world-writable folder",
                       "any user of the node can put a library there, and the module loads it"),
    "absolute": ("error", "an absolute folder outside the prefix (a build machine's path)",
                 "on a node the loader searches that folder before the environment's own libraries: there it "
                 "holds nothing or somebody else's; only on the build machine does it hold what the build linked. "
                 "The audit does not search it"),
    "system": ("warning", "a system folder",
               "searched in this position, it lets the system's copy of a library shadow the environment's; "
               "the loader searches the system folders last anyway"),
}


@dataclass(frozen=True)
class Placement:
    """Where a module lies in the environment it installs into."""

    module_dir: PurePosixPath | None  # relative to the prefix; None: unknown (a bare .so)
    prefixes: tuple[str, ...]  # absolute paths that mean "the prefix" (on disk, or a package's placeholder)
    root_on_disk: Path | None = None  # an installed prefix whose folders' modes are the node's


def placement(kind: str, rel: str, root: Path, env_root: Path | None, placeholder: str | None = None) -> Placement:
    """Where a module of an audit target (kind as in packaging.Payload) lies in its environment."""
    prefixes = [str(env_root)] if env_root else []
    folder = PurePosixPath(rel).parent
    if kind == "prefix":
        return Placement(folder, tuple(dict.fromkeys([str(Path(os.path.normpath(root.absolute()))), *prefixes])), root)
    if kind == "conda":
        # Clients write the install prefix over the placeholder, so what lies under it is the
        # prefix; a placeholder that is no absolute folder ("/", "x") replaces nothing sensible.
        if placeholder and placeholder.startswith("/") and posixpath.normpath(placeholder) != "/":
            return Placement(folder, tuple([posixpath.normpath(placeholder), *prefixes]))
        return Placement(folder, tuple(prefixes))
    if kind == "wheel":  # a wheel's root is site-packages; the python version does not change the depth
        return Placement(PurePosixPath("lib/python3/site-packages") / folder, tuple(prefixes))
    return Placement(None, tuple(prefixes))


def judge(entry: str, where: Placement) -> tuple[str, str | None]:
    """(verdict, where it leads): 'origin' or 'prefix' (vouched for, with the prefix-relative folder
    when known), else a key of VERDICTS."""
    for token, value in _TOKENS.items():
        entry = entry.replace(token, value)
    rest = next((entry[len(t):] for t in _ORIGIN if entry.startswith(t) and entry[len(t):][:1] in ("", "/")), None)
    if rest is None and not entry.startswith("/"):
        return "cwd", None
    if rest is not None:
        if where.module_dir is None:
            return "origin", None
        inside = posixpath.normpath(posixpath.join(str(where.module_dir), rest.lstrip("/")))
        if inside == ".." or inside.startswith("../"):
            return "escapes", inside
        return _on_disk(where, inside, "origin")
    norm = posixpath.normpath(entry)
    for prefix in where.prefixes:
        if norm == prefix or norm.startswith(prefix.rstrip("/") + "/"):
            return _on_disk(where, posixpath.relpath(norm, prefix), "prefix")
    if any(norm == d or norm.startswith(d + "/") for d in WORLD_WRITABLE) or _world_writable(Path(norm), Path("/")):
        return "world-writable", norm
    if Path(norm) in SYSTEM_DIRS:
        return "system", norm
    return "absolute", norm


def _on_disk(where: Placement, inside: str, verdict: str) -> tuple[str, str | None]:
    if where.root_on_disk is not None and _world_writable(where.root_on_disk / inside, where.root_on_disk):
        return "world-writable", str(where.root_on_disk / inside)
    return verdict, inside


def _world_writable(folder: Path, top: Path) -> bool:
    """Whether anyone can put a file at `folder`: it, or a folder between top and it, is writable by
    all (a sticky ancestor still lets anyone create the missing rest of the path)."""
    folder = Path(os.path.normpath(folder))
    current, child_missing = folder, False
    while True:
        try:
            st = current.lstat()
        except OSError:
            child_missing = True
        else:
            if st.st_mode & stat.S_IWOTH and (current == folder or child_missing or not st.st_mode & stat.S_ISVTX):
                return True
            child_missing = False
        if current == top or current == current.parent:
            return False
        current = current.parent


def search_path_findings(rel: str, tags: list[tuple[str, list[str]]], where: Placement) -> list[Finding]:
    """Findings for every entry of the module's RPATH, RUNPATH and path-named NEEDED that the
    audit cannot vouch for."""
    findings = []
    for tag, entries in tags:
        for entry in entries:
            verdict, leads = judge(entry, where)
            if verdict not in VERDICTS:
                continue
            severity, what, cause = VERDICTS[verdict]
            shown = repr(entry) if entry else "'' (an empty entry)"
            to = f" ({leads})" if leads and leads != entry else ""
            findings.append(Finding(
                severity, "libraries", f"{rel}: {tag} {shown} is {what}{to}", module=rel, library=entry or None,
                cause=cause,
                fix="keep library paths relative to the module ($ORIGIN/../lib: rattler-build's relinking "
                    "writes such RPATHs) or drop the entry (patchelf --remove-rpath / --set-rpath)"
                    if tag != "NEEDED" else "link against the library by name (-lNAME), not by path",
            ))
    return findings
