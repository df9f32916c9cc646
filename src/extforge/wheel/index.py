"""The wheel index: one PEP 503/691 "simple" index per torch row, served from a folder.

    DIR/torch2.14.1-cu130/simple/index.html                 the project list (and index.json)
    DIR/torch2.14.1-cu130/simple/demo-ext/index.html        the project's files (and index.json)
    DIR/torch2.14.1-cu130/simple/demo-ext/demo_ext-0.1.0+cu130torch2.14cxx11abiTRUE-cp311-cp311-manylinux_2_34_x86_64.whl

pip and uv read `index.html` of a folder for a file:// index; an HTTP server serves the same
folder (docs/site-admin.md). Every link carries the wheel's sha256, so a wheel swapped behind
the index's back is refused by the client at install. Beside each wheel lies its METADATA as
`<wheel>.metadata` (PEP 658), announced with its sha256 as PyPI does (`data-core-metadata` and
the older `data-dist-info-metadata` in the HTML, `core-metadata` and `data-dist-info-metadata`
in the JSON, PEP 714): a resolver reads a few KiB per candidate instead of the whole wheel.

Publishing follows the channel's rules (publishing/publish.py): the caller has audited what it
publishes; under one exclusive lock at DIR, every wheel is checked before anything is written
(a file name published with other bytes is refused: a wheel's name is its identity), copied in
through a temporary and renamed, logged in DIR/publish-log.jsonl, and only then listed: pages
are written from the log (the hashes published, never those of whatever lies in the folder
now), each atomically. Every change goes through safe_files, anchored at DIR.
"""

from __future__ import annotations

import getpass
import hashlib
import html
import json
import os
import re
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from .. import shared_read
from ..errors import ExtforgeError
from ..locking import exclusive
from ..safe_files import append, atomic_writer, make_dir, make_dirs, names, read_bytes, remove_quietly, truncate, write_atomic
from .make import Wheel

LOCK_NAME = ".extforge-wheels.lock"
LOG_NAME = "publish-log.jsonl"
LOG_LIMIT = 1 << 30
TEMP_PREFIX = "extforge-"
API_VERSION = "1.1"
METADATA_SUFFIX = ".metadata"


def project_name(project: str) -> str:
    """PEP 503's normalized name: the folder pip and uv ask for (Demo_Ext -> demo-ext)."""
    return re.sub(r"[-_.]+", "-", project).lower()


@dataclass
class PublishedWheel:
    file: str  # row/simple/project/filename, relative to DIR
    sha256: str
    status: str  # "published" | "already-present"
    audit: str


@dataclass
class WheelPublish:
    index: str
    wheels: list[PublishedWheel] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # wheel files in a project folder no log entry vouches for

    def to_json(self) -> dict:
        return asdict(self)


def _log(root: Path) -> list[dict]:
    """The publish log's entries (torn lines skipped), read without following a link."""
    try:
        text = read_bytes(root / LOG_NAME, limit=LOG_LIMIT, beneath=root).decode(errors="replace")
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("file", "sha256")):
            entries.append(entry)
    return entries


def served_versions(index: Path) -> dict[str, dict[str, list[str]]]:
    """row -> project (PEP 503 name) -> the versions of its wheels the publish log vouches for and
    the index still holds (read without the lock: a published wheel is never taken back)."""
    root = Path(index).resolve()
    served: dict[str, dict[str, list[str]]] = {}
    for entry in _log(root) if root.is_dir() else []:
        parts = entry["file"].split("/")
        version = entry.get("version")
        if (len(parts) == 4 and parts[1] == "simple" and ".." not in parts and isinstance(version, str)
                and _regular(root.joinpath(*parts)) is not None):
            served.setdefault(parts[0], {}).setdefault(parts[2], []).append(version)
    return served


def _digest(root: Path, path: Path, size: int) -> str | None:
    """The sha256 of the file at path in the index tree, read by the one reader (no link followed,
    a FIFO never waited on); None where it is no regular file of at most `size` bytes (then not
    the file of that size it is compared with)."""
    try:
        return shared_read.sha256(path, limit=size, beneath=root)
    except (FileNotFoundError, shared_read.Refused):
        return None


def _regular(path: Path) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _folder(root: Path, rel: str) -> Path:
    """root/rel made folder by folder, each refused if a link or a file is in its place."""
    path = root
    for part in rel.split("/"):
        path = path / part
        make_dir(path, like=root)
    return path


def _project_page(project: str, files: list[dict]) -> tuple[bytes, bytes]:
    """(index.html, index.json) of one project: PEP 503 links and the PEP 691 document."""
    links = []
    for f in files:
        python = f' data-requires-python="{html.escape(f["requires_python"])}"' if f.get("requires_python") else ""
        core = (f' data-dist-info-metadata="sha256={html.escape(f["metadata"])}" data-core-metadata="sha256='
                f'{html.escape(f["metadata"])}"') if f.get("metadata") else ""
        links.append(f'    <a href="{quote(f["filename"])}#sha256={f["sha256"]}"{python}{core}>{html.escape(f["filename"])}</a><br/>')
    page = (f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
            f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
            f"    <h1>Links for {html.escape(project)}</h1>\n" + "\n".join(links) + "\n  </body>\n</html>\n")
    document = {
        "meta": {"api-version": API_VERSION},
        "name": project,
        "versions": sorted({f["version"] for f in files if f.get("version")}),
        "files": [{"filename": f["filename"], "url": quote(f["filename"]), "hashes": {"sha256": f["sha256"]},
                   "requires-python": f.get("requires_python") or None, "size": f["size"],
                   **({"core-metadata": {"sha256": f["metadata"]}, "data-dist-info-metadata": {"sha256": f["metadata"]}}
                      if f.get("metadata") else {})} for f in files],
    }
    return page.encode(), (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def _list_page(projects: list[str]) -> tuple[bytes, bytes]:
    links = "\n".join(f'    <a href="{quote(p)}/">{html.escape(p)}</a><br/>' for p in projects)
    page = (f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
            f"    <title>Simple index</title>\n  </head>\n  <body>\n{links}\n  </body>\n</html>\n")
    document = {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in projects]}
    return page.encode(), (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def _write_pages(root: Path, rows: set[str], entries: list[dict], result: WheelPublish) -> None:
    """Every page of the given rows, from the log's last entry for each file that is still there."""
    last: dict[str, dict] = {}
    for entry in entries:
        last[entry["file"]] = entry
    for row in sorted(rows):
        projects: dict[str, list[dict]] = {}
        for rel, entry in sorted(last.items()):
            row_of, _, rest = rel.partition("/simple/")
            project, _, filename = rest.partition("/")
            st = _regular(root / rel)
            if row_of != row or "/" in filename or st is None:
                continue
            # Announced only where the log vouches for its hash and the file is there to fetch.
            core = entry.get("metadata_sha256") if _regular(root / (rel + METADATA_SUFFIX)) else None
            projects.setdefault(project, []).append({**entry, "filename": filename, "size": st.st_size,
                                                     "metadata": core if isinstance(core, str) else None})
        simple = root / row / "simple"
        for project in sorted(projects):
            folder = simple / project
            listed = {f["filename"] for f in projects[project]}
            result.ignored += [f"{row}/simple/{project}/{n}" for n in sorted(names(folder, beneath=root))
                               if n.endswith(".whl") and not n.startswith(".") and n not in listed]
            page, document = _project_page(project, projects[project])
            write_atomic(folder / "index.html", page, beneath=root)
            write_atomic(folder / "index.json", document, beneath=root)
        page, document = _list_page(sorted(projects))
        write_atomic(simple / "index.html", page, beneath=root)
        write_atomic(simple / "index.json", document, beneath=root)


def _remove_leftovers(root: Path, folder: Path) -> None:
    """Temporaries of publishers that died mid-copy (only while holding the lock)."""
    for name in names(folder, beneath=root):
        if name.startswith(f".{TEMP_PREFIX}") and name.endswith(".tmp"):
            remove_quietly(folder / name, beneath=root)


def _write_metadata(root: Path, dest: Path, wheel: Wheel, copied: list[Path]) -> str:
    """The wheel's METADATA beside it (PEP 658), written unless that file is there with those
    bytes (a wheel published before the index had them gets its own); its sha256."""
    path = dest.with_name(dest.name + METADATA_SUFFIX)
    digest = hashlib.sha256(wheel.metadata).hexdigest()
    if _digest(root, path, len(wheel.metadata)) == digest:
        return digest
    if not os.path.lexists(path):
        copied.append(path)
    with atomic_writer(path, beneath=root, tmp_prefix=TEMP_PREFIX) as out:
        out.write(wheel.metadata)
    return digest


def publish_wheels(wheels: list[tuple[Wheel, str]], index: Path) -> WheelPublish:
    """Publish audited wheels ((wheel, audit verdict) each) into the wheel index folder `index`."""
    root = Path(index).resolve()
    make_dirs(root)
    result = WheelPublish(str(root))
    with exclusive(root / LOCK_NAME):
        entries = _log(root)
        published = {e["file"]: e for e in entries}
        planned: list[tuple[Wheel, str, str, bool]] = []  # wheel, rel, verdict, already there
        for wheel, verdict in wheels:
            rel = f"{wheel.torch.row}/simple/{project_name(wheel.project)}/{wheel.path.name}"
            there = os.path.lexists(root / rel)
            if there:
                digest = _digest(root, root / rel, wheel.path.stat().st_size)
                if digest != wheel.sha256:
                    by = published.get(rel, {})
                    seen = f"sha256 {digest[:12]}…" if digest else "no regular file of its size"
                    raise ExtforgeError(
                        f"{rel} is already in {root} with other bytes",
                        f"a wheel's file name is its identity: pip, uv and every lock that saw the old bytes "
                        f"({seen}, published by {by.get('user', '?')} at {by.get('time', '?')}) would break",
                        "bump the build number (recipe build.number) and rebuild", exit_code=1)
            if any(rel == r for _, r, _, _ in planned):
                continue
            planned.append((wheel, rel, verdict, there))
        rows = {rel.split("/", 1)[0] for _, rel, _, _ in planned}
        copied: list[Path] = []
        log = []
        had_log = os.path.lexists(root / LOG_NAME)
        log_size: int | None = None
        try:
            for wheel, rel, verdict, there in planned:
                status = "already-present" if there else "published"
                dest = root / rel
                if not there:
                    folder = _folder(root, str(Path(rel).parent))
                    _remove_leftovers(root, folder)
                    copied.append(dest)
                    with atomic_writer(dest, beneath=root, tmp_prefix=TEMP_PREFIX) as out, wheel.path.open("rb") as src:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    if _digest(root, dest, wheel.path.stat().st_size) != wheel.sha256:
                        raise ExtforgeError(f"{wheel.path} changed while it was copied into {root}", "",
                                            "publish it again", exit_code=1)
                metadata_sha256 = _write_metadata(root, dest, wheel, copied)
                result.wheels.append(PublishedWheel(rel, wheel.sha256, status, verdict))
                log.append({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "user": getpass.getuser(),
                            "host": socket.gethostname(), "file": rel, "sha256": wheel.sha256, "status": status,
                            "audit": verdict, "project": wheel.project, "version": wheel.version,
                            "requires_python": wheel.requires_python, "metadata_sha256": metadata_sha256})
            # Logged before any page lists them: a page never names a wheel the log does not vouch for.
            log_size = append(root / LOG_NAME, "".join(json.dumps(e, sort_keys=True) + "\n" for e in log).encode(),
                              beneath=root)
            _write_pages(root, rows, [*entries, *log], result)
        except BaseException:
            for path in copied:
                remove_quietly(path, beneath=root)
            if log_size is not None and had_log:
                truncate(root / LOG_NAME, log_size)
            elif log_size is not None:
                remove_quietly(root / LOG_NAME, beneath=root)
            raise
    return result
