"""What a channel string names: a URL for rattler, a local folder, the packages its index lists.

Channels reach extforge as folders (`./out`, `~/channels/internal`), file:// URLs (written by
`Path.as_uri()`, so a space is `%20` and a `#` is `%23`) or remote URLs. Every module that
turns one into a folder goes through `local_folder`, which un-quotes: a channel folder whose
path holds a space or a `#` is the same folder whichever way it was named.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from .errors import ExtforgeError
from .shared_read import Refused, read_bytes, read_json

SUBDIRS = ("linux-64", "noarch")
# A repodata.json bigger than this is no channel's (conda-forge's linux-64 is ~300 MB).
REPODATA_LIMIT = 2 << 30
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")


def is_url(channel: str | Path) -> bool:
    return bool(_SCHEME.match(str(channel)))


def channel_url(channel: str | Path) -> str:
    """A URL for rattler: folders become file:// URLs, URLs pass through."""
    text = str(channel)
    if is_url(text):
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ExtforgeError(
            f"channel {text} is neither a URL nor an existing folder",
            "extforge build only uses the channels it is given (never an implicit conda-forge)",
            "pass --channel with a channel folder (e.g. one written by `extforge mirror`) or a URL",
        )
    return path.resolve().as_uri()


def local_folder(channel: str | Path) -> Path | None:
    """The folder of a channel given as a path or file:// URL (un-quoted); None for remote channels."""
    text = str(channel)
    if text.startswith("file://"):
        return Path(url2pathname(urlparse(text).path))
    if is_url(text):
        return None
    return Path(text).expanduser().resolve()


def repodata(channel: str | Path, subdir: str) -> dict[str, Any]:
    """The parsed `<subdir>/repodata.json` of a local channel, by the one reader of shared places (a
    channel is a folder other admins write: a FIFO or a link planted there is not followed, an endless
    file not read past REPODATA_LIMIT); {} for remote, unindexed or unreadable ones."""
    folder = local_folder(channel)
    if folder is None:
        return {}
    try:
        return read_json(folder / subdir / "repodata.json", lambda data: data if isinstance(data, dict) else {},
                         limit=REPODATA_LIMIT)
    except (OSError, Refused):
        return {}


def records(channel: str | Path, subdir: str) -> dict[str, dict[str, Any]]:
    """Filename -> record of every package the subdir's index lists (.conda and .tar.bz2); entries
    that are no record (no name, version and build strings, depends other than a list of
    strings) are left out."""
    data = repodata(channel, subdir)
    out: dict[str, dict[str, Any]] = {}
    for key in ("packages", "packages.conda"):
        listed = data.get(key)
        if isinstance(listed, dict):
            out |= {f: r for f, r in listed.items() if isinstance(r, dict)
                    and all(isinstance(r.get(k), str) for k in ("name", "version", "build"))
                    and isinstance(depends := r.get("depends", []), list) and all(isinstance(d, str) for d in depends)}
    return out


def listing(channel: str | Path | None, subdirs: Iterable[str]) -> set[str]:
    """"<subdir>/<file>" of every package the channel's index lists in `subdirs`."""
    if channel is None:
        return set()
    return {f"{subdir}/{name}" for subdir in sorted(subdirs) for name in records(channel, subdir)}


def all_records(channels: Iterable[str | Path], subdir: str = "linux-64") -> Iterator[dict[str, Any]]:
    """Every record the indexes of local `channels` list for `subdir` and noarch."""
    for ch in channels:
        for sub in (subdir, "noarch"):
            yield from records(ch, sub).values()


def package_names(channels: Sequence[str | Path], subdir: str = "linux-64") -> set[str]:
    """Names of the packages local `channels` hold for `subdir` and noarch."""
    return {rec["name"] for rec in all_records(channels, subdir)}


def virtual_packages(subdir: str, *, linux: str, glibc: str, extra: Mapping[str, str] | None = None) -> list[Any]:
    """The virtual packages a solve for nodes of `subdir` assumes (rattler GenericVirtualPackage):
    a CPU-only build host has no `__cuda`, so lock and audit name the nodes' own. `extra` holds the
    others by name (`__cuda`: its version; `__archspec`: the microarchitecture, its build string)."""
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version

    def vp(name: str, version: str, build: str = "0") -> GenericVirtualPackage:
        return GenericVirtualPackage(PackageName(name), Version(version), BuildString(build))

    extra = extra or {}
    out = []
    if subdir.startswith("linux"):
        out += [vp("__unix", "0"), vp("__linux", linux), vp("__glibc", glibc)]
    for name, value in sorted(extra.items()):
        if name == "__archspec":
            out.append(vp(name, "1", value))
        elif name not in ("__linux", "__glibc"):
            out.append(vp(name, value))
    if subdir == "linux-64" and "__archspec" not in extra:
        out.append(vp("__archspec", "1"))
    return out


def repodata_mentions(channels: Sequence[str | Path], text: str) -> bool:
    """Whether the raw index of any local channel contains `text` (a cheap look for e.g. `"__cuda`)."""
    for ch in channels:
        folder = local_folder(ch)
        if folder is None:
            continue
        for sub in SUBDIRS:
            with contextlib.suppress(OSError, Refused):
                if text.encode() in read_bytes(folder / sub / "repodata.json", limit=REPODATA_LIMIT):
                    return True
    return False
