"""`extforge install ENV --prefix P`: exactly what pixi.lock says, no solve.

Every package is fetched into a content-addressed store (from the store, or from the lock's
URL through this site's mirror: a channel folder or HTTP), its sha256 compared with the lock
and its members checked for paths that leave the prefix, all before anything is linked. rattler then installs the verified copies
into a staging folder next to P (prefix placeholders are patched with P's path), which is
renamed into place: a refusal or a crash leaves P as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..archive import check_package
from ..errors import EXIT_FINDINGS, ExtforgeError
from ..paths import cache_root, rattler_cache_dir
from .hashing import sha256_file
from .mirrors import Mirrors


def read_prefix_records(prefix: Path) -> list[dict]:
    meta = prefix / "conda-meta"
    if not meta.is_dir():
        raise ExtforgeError(f"{prefix} is not a conda environment", "it has no conda-meta folder", "pass the prefix given to `extforge install`")
    records = []
    for p in sorted(meta.glob("*.json")):
        try:
            record = json.loads(p.read_bytes())
        except (OSError, ValueError) as exc:
            record, why = None, str(exc)
        else:
            why = "it is not a package record (name, version, build)"
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("name", "version", "build")):
            raise ExtforgeError(
                f"{p} is not a readable package record", why,
                "the environment was damaged or edited: reinstall it with `extforge install` into a new prefix",
                exit_code=1,
            )
        records.append(record)
    return records


@dataclass
class InstallResult:
    prefix: Path
    environment: str
    packages: int = 0
    status: str = "installed"  # "installed" | "already-installed"
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "prefix": str(self.prefix),
            "environment": self.environment,
            "packages": self.packages,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


def store_dir() -> Path:
    return cache_root() / "pkgs"


def locked_records(lock_path: Path, env: str, platform: str = "linux-64") -> list:
    from rattler import LockFile

    if not lock_path.is_file():
        raise ExtforgeError(f"lock file {lock_path} not found", "", "run `extforge lock` first or pass --lock PATH")
    try:
        lock_file = LockFile.from_path(lock_path)
    except Exception as exc:  # rattler's ParseCondaLockError and I/O errors
        raise ExtforgeError(f"cannot read {lock_path}", str(exc), "restore it from version control or re-run `extforge lock`") from exc
    environment = lock_file.environment(env)
    if environment is None:
        names = [name for name, _ in lock_file.environments()]
        raise ExtforgeError(f"environment {env!r} is not in {lock_path}", f"it has: {', '.join(names)}", "pass one of those or re-run `extforge lock`")
    # rattler wants the lock file's own platform object, not a new LockPlatform.
    owned = next((p for p in environment.platforms() if p.name == platform), None)
    records = environment.conda_repodata_records_for_platform(owned) if owned else None
    if records is None:
        raise ExtforgeError(f"{lock_path} has no {platform} packages for {env!r}", "", f"add {platform} to the workspace platforms and re-lock")
    return records


def record_sha256(record: Any) -> str:
    value = record.sha256
    if value is None:
        raise ExtforgeError(f"{record.file_name} has no sha256 in the lock", "install refuses what it cannot verify", "re-lock against a channel indexed with sha256")
    return value.hex() if isinstance(value, bytes) else str(value)


def _fetch_into(url: str, dest: Path) -> str:
    """Copy or download url to dest through a temp name; return the sha256 of the bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    parsed = urlparse(url)
    try:
        with tmp.open("wb") as out:
            if parsed.scheme == "file" or not parsed.scheme:
                digest = sha256_file(unquote(parsed.path) if parsed.scheme else url, copy_to=out)
            else:
                import hashlib

                h = hashlib.sha256()
                with urllib.request.urlopen(url, timeout=60) as resp:
                    while chunk := resp.read(4 * 1024 * 1024):
                        h.update(chunk)
                        out.write(chunk)
                digest = h.hexdigest()
        tmp.replace(dest)
        return digest
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ExtforgeError(
            f"cannot fetch {url}",
            str(exc),
            "check that the channel is reachable from this node, or point its channel at the site's mirror "
            "([mirrors] in pixi's config.toml, or --channel-map NAME=URL)",
        ) from exc


def fetch_verified(records: list, store: Path, mirrors: Mirrors | None = None) -> tuple[dict[str, Path], list[str]]:
    """Verified local copies by file name, and the packages whose bytes differ from the lock."""
    mirrors = mirrors or Mirrors()
    local: dict[str, Path] = {}
    bad = []
    for r in records:
        want = record_sha256(r)
        dest = store / want / r.file_name
        source = mirrors.redirect(r.url)
        got = sha256_file(dest) if dest.is_file() else _fetch_into(source, dest)
        if got != want:
            dest.unlink(missing_ok=True)
            bad.append(f"{r.file_name} (lock sha256 {want[:12]}…, got {got[:12]}… from {source})")
            continue
        local[r.file_name] = dest
    return local, bad


def installed_identity(prefix: Path) -> set[tuple[str, str, str, str]] | None:
    """(name, version, build, sha256) of each package in a prefix's conda-meta, None if none."""
    if not (prefix / "conda-meta").is_dir():
        return None
    return {(d["name"], d["version"], d["build"], d.get("sha256", "")) for d in read_prefix_records(prefix)}


def _identity(records: list) -> set[tuple[str, str, str, str]]:
    return {(r.name.normalized, str(r.version), str(r.build), record_sha256(r)) for r in records}


def install_env(lock_path: Path, env: str, prefix: Path, *, platform: str = "linux-64", mirrors: Mirrors | None = None) -> InstallResult:
    from rattler import install

    start = time.monotonic()
    prefix = prefix.resolve()
    result = InstallResult(prefix=prefix, environment=env)
    records = locked_records(lock_path, env, platform)
    result.packages = len(records)
    if prefix.exists() and not prefix.is_dir():
        raise ExtforgeError(f"prefix {prefix} is a file, not a folder", "", "pass a new or empty folder as --prefix")
    if prefix.exists() and any(prefix.iterdir()):
        if installed_identity(prefix) == _identity(records):
            result.status = "already-installed"
            result.seconds = time.monotonic() - start
            return result
        raise ExtforgeError(
            f"prefix {prefix} is not empty and does not hold environment {env!r} of {lock_path.name}",
            "installing over other files would mix two environments",
            "pass a new or empty --prefix, or delete this one first",
        )

    t = time.monotonic()
    local, bad = fetch_verified(records, store_dir(), mirrors)
    if bad:
        raise ExtforgeError(
            f"{len(bad)} package(s) differ from {lock_path.name}: " + "; ".join(bad),
            "their bytes changed after the environment was locked (tampering, or a file replaced on the channel)",
            "nothing was installed; restore the channel's files, or re-lock if the change is intended",
            exit_code=EXIT_FINDINGS,
        )
    for path in local.values():
        check_package(path)
    result.timings["fetch_verify"] = time.monotonic() - t

    originals = {}
    for r in records:
        originals[r.file_name] = (r.url, r.channel)
        r.url = local[r.file_name].as_uri()
    staging = prefix.parent / f".{prefix.name}.extforge-staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    try:
        asyncio.run(
            install(
                records,
                staging,
                cache_dir=rattler_cache_dir() / "pkgs",
                alternative_target_prefix=prefix,
                show_progress=False,
                execute_link_scripts=False,
            )
        )
        _restore_urls(staging / "conda-meta", originals)
        if prefix.exists():
            prefix.rmdir()  # empty, checked above
        os.rename(staging, prefix)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.timings["link"] = time.monotonic() - t
    result.seconds = time.monotonic() - start
    return result


def _restore_urls(meta: Path, originals: dict[str, tuple[str, str]]) -> None:
    """Record the channel URLs of the lock in conda-meta, not the local store's paths."""
    for f in meta.glob("*.json"):
        d = json.loads(f.read_text())
        if d.get("fn") in originals:
            d["url"], d["channel"] = originals[d["fn"]]
            f.write_text(json.dumps(d, indent=2) + "\n")
