"""Where extforge keeps state outside a checkout."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The content-addressed cache shared by every checkout on this machine.

    Kept outside the clone so CI on a fresh clone reuses big downloads and built
    upstream packages; everything in it can be rebuilt, so deleting it is always safe.
    """
    env = os.environ.get("EXTFORGE_CACHE")
    if env:
        return Path(env).expanduser()
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
