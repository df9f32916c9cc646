"""Where extforge keeps state outside a checkout."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ExtforgeError
from .safe_files import remove_quietly, touch


def cache_root() -> Path:
    """The content-addressed cache shared by every checkout on this machine.

    Kept outside the clone so CI on a fresh clone reuses big downloads and built
    upstream packages; everything in it can be rebuilt, so deleting it is always safe.
    """
    env = os.environ.get("EXTFORGE_CACHE")
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():
            raise ExtforgeError(f"$EXTFORGE_CACHE={env!r} is a relative path",
                                "it would name another folder in every directory extforge runs from",
                                "set it to an absolute path (e.g. $HOME/.cache/extforge) or unset it")
        if path.exists() and not path.is_dir():
            raise ExtforgeError(f"$EXTFORGE_CACHE={env!r} is not a folder", "extforge keeps its cache's folders there",
                                "point it at a folder (it is created if missing) or unset it")
        return path
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "extforge"


def rattler_cache_dir() -> Path:
    """Package cache for rattler installs and rattler-build environments.

    rattler-build otherwise extracts into ~/.cache/rattler (5 GB for a torch build env);
    keeping it under our cache root makes one knob control all of extforge's disk use.
    """
    env = os.environ.get("RATTLER_CACHE_DIR")
    return Path(env) if env else cache_root() / "rattler"


def rattler_pkgs_dir() -> Path:
    """Where packages are extracted: rattler-build's layout under RATTLER_CACHE_DIR. py-rattler's
    install takes the extraction folder itself; given rattler_cache_dir() it would keep a second
    copy of every torch (~5 GB) beside rattler-build's."""
    return rattler_cache_dir() / "pkgs"


def mark_used(path: Path) -> None:
    """Record that a cache entry was reused now (its mtime), so `extforge cache --prune` keeps it."""
    try:
        touch(path)
    except (OSError, ExtforgeError):
        pass  # a read-only shared cache: the entry then ages by its creation time


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Folders of the naming before scratch_dir carry no pid; a day-old one belongs to no live run.
_LEGACY_SCRATCH_AGE_S = 24 * 3600


def sweep_scratch(kind: str, base: Path | None = None) -> list[Path]:
    """Remove scratch folders of `kind` that runs killed on this host left behind (their pid is gone)."""
    base = Path(tempfile.gettempdir()) if base is None else base
    mine = f"extforge-{kind}-{socket.gethostname()}-"
    removed = []
    for path in base.glob(f"extforge-{kind}-*"):
        if path.name.startswith(mine):
            pid = path.name[len(mine):].split("-", 1)[0]
            stale = pid.isdigit() and not _alive(int(pid))
        else:
            try:
                stale = path.name.count("-") == 2 and time.time() - path.lstat().st_mtime > _LEGACY_SCRATCH_AGE_S
            except OSError:
                stale = False
        if stale and path.is_dir() and not path.is_symlink():
            remove_quietly(path)
            removed.append(path)
    return removed


@contextmanager
def scratch_dir(kind: str) -> Iterator[Path]:
    """A temporary folder `extforge-KIND-HOST-PID-*` in TMPDIR, removed on every exit path.

    A SIGKILL skips every cleanup, so each new one first removes those of dead runs on this host."""
    sweep_scratch(kind)
    path = Path(tempfile.mkdtemp(prefix=f"extforge-{kind}-{socket.gethostname()}-{os.getpid()}-"))
    try:
        yield path
    finally:
        remove_quietly(path)
