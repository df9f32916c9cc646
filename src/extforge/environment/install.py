"""`extforge install ENV --prefix P`: exactly what pixi.lock says, no solve.

Every package is fetched into a content-addressed store (from the store, or from the lock's
URL through this site's mirror: a channel folder or HTTP), its sha256 compared with the lock
and its members checked for paths that leave the prefix, all before anything is linked. rattler then installs the verified copies
into a staging folder inside P (P/.extforge/, prefix placeholders patched with P's path), whose
entries are renamed into P once every file is checked (a file that is a package-cache file an
install verified before, by its inode, extracted.py; every other by its hash): a refusal
leaves P as it was. Everything
install writes lies inside P, so a prefix pre-created by its owner inside a folder only root can
write (/nfs/envs/team-x in a root-owned /nfs/envs) installs; the next run removes what a killed
run left there (its staging folder, a half-done move).

Install acts only on what it made: the prefix must be the installing user's own (its owner
could swap lib/ after the checks), and its work folder P/.extforge, which holds the lock, the
staging folder and the journal of what a killed run must undo, is trusted only when this
user made it, private (0700). The journal is written before the staging folder exists and
removed only after it is gone; it names the prefix and carries an HMAC keyed by the user's
private trust folder (trust.sign, as verify's record), so a journal this user's install did not
write for this prefix (edited, copied from another prefix, signed with another user's key) and
a staging folder no journal names are refused, with nothing deleted. Every change inside P
goes through safe_files, anchored at P.
The python package's interpreter runs once, as the installing user, to byte-compile the
modules (as conda and pixi do), isolated and without site processing, from a folder install
places itself (P/.extforge/staging-N/.extforge/python): hard links of the python package's own
files, checked against its manifest (a link to each staged folder that holds its files alone),
and nothing of the other packages, so no library, module or `.pth` file another package puts
into the environment is in its reach. A lock where another
package ships a path of python's interpreter (its executable, libpython, the standard library)
is refused before anything is linked: rattler could keep that package's copy in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import safe_files
from ..cache import make_room
from ..errors import EXIT_FINDINGS, ExtforgeError, from_os_error
from ..hashing import sha256_file
from ..locking import Busy, exclusive_or_busy
from ..paths import cache_root, rattler_pkgs_dir
from . import extracted
from .accounting import user_name
from .mirrors import Mirrors
from .packages import fetch_verified, locked_records, read_prefix_records, record_sha256, store_dir
from .receipt import Pinned, Receipt, compile_bytecode, write_receipt
from .trust import (
    ARCHIVE_DIGESTS,
    PYTHON,
    PackageRef,
    check_archives,
    expected_paths,
    interpreter_clashes,
    interpreter_path,
    manifests_for,
    owned_paths,
    sign,
    trust_dir,
    verify_signed,
)
from .verify import VerifyReport, check_files, verify_prefix


@dataclass
class InstallResult:
    prefix: Path
    environment: str
    packages: int = 0
    status: str = "installed"  # "installed" | "already-installed"
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # Files the package cache gave wrong, before install re-extracted them from the verified packages.
    cache_mismatches: list[str] = field(default_factory=list)
    # Archives whose member paths were checked in this install (the others had passed before).
    archives_checked: int = 0
    # Files read to check them, of those linked: the package cache's files verified before are not.
    files_hashed: int = 0
    # Modules the interpreter was asked about (compiled where their .pyc would not do): not those
    # whose shipped .pyc it found current before.
    modules_checked: int = 0

    def to_json(self) -> dict:
        return {
            "prefix": str(self.prefix),
            "environment": self.environment,
            "packages": self.packages,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "cache_mismatches": self.cache_mismatches,
            "archives_checked": self.archives_checked,
            "files_hashed": self.files_hashed,
            "modules_checked": self.modules_checked,
        }


def installed_identity(prefix: Path) -> set[tuple[str, str, str, str]] | None:
    """(name, version, build, sha256) of each package in a prefix's conda-meta, None if none."""
    if not (prefix / "conda-meta").is_dir():
        return None
    return {(d["name"], d["version"], d["build"], d.get("sha256", "")) for d in read_prefix_records(prefix)}


def _identity(records: list) -> set[tuple[str, str, str, str]]:
    return {(r.name.normalized, str(r.version), str(r.build), record_sha256(r)) for r in records}


# install's own folder inside the prefix: its lock, staging folder and journal.
WORK = ".extforge"
JOURNAL = "moving.json"
# Marks a signed body as an install journal: the same key signs verify's records and manifests.
_JOURNAL_SCHEMA = 1


def install_lock_path(prefix: Path) -> Path:
    """Inside the prefix, where its owner can write; removed when the install ends."""
    return prefix / WORK / "install.lock"


def _prepare_prefix(named: Path) -> tuple[Path, list[Path]]:
    """The prefix, resolved and created with its work folder, and the folders created for it
    (deepest first), which are removed again if the install does not happen."""
    if named.is_symlink() and not named.exists():
        raise ExtforgeError(
            f"prefix {named} is a symbolic link to {os.readlink(named)}, which does not exist or loops",
            "installing through it would put the environment outside the folder named, or cannot work",
            "pass a real folder as --prefix (or create the link's target first)",
        )
    try:
        prefix = named.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # a symlink loop further up the path
        raise ExtforgeError(f"prefix {named} cannot be resolved", str(exc), "pass a path without symbolic-link loops") from None
    if prefix.exists() and not prefix.is_dir():
        raise ExtforgeError(f"prefix {prefix} is a file, not a folder", "", "pass a new or empty folder as --prefix")
    if prefix.exists():
        _require_own_prefix(prefix)
    created = [p for p in (prefix, *prefix.parents) if not p.exists()]
    work = prefix / WORK
    try:
        safe_files.make_dirs(prefix)
        safe_files.make_private_dir(work, beneath=prefix)
    except OSError as exc:
        _remove_created(prefix, created)
        raise ExtforgeError(
            f"cannot create {work if prefix.is_dir() else prefix}: {exc.strerror}",
            "install writes only inside the prefix, and this user cannot create or write it",
            "pass a prefix you can write; a shared tree's admin pre-creates it for you (only the prefix itself must be yours)",
        ) from None
    return prefix, created


def _require_own_prefix(prefix: Path) -> None:
    owner = prefix.lstat().st_uid
    if owner != os.geteuid():
        me = user_name(os.geteuid())
        raise ExtforgeError(
            f"prefix {prefix} belongs to {user_name(owner)}, not to you ({me})",
            "whoever owns the folder can replace what is in it (lib/, bin/) after install has checked it, "
            "and you would run their files; install creates environments only in folders of the installing user",
            f"install as {user_name(owner)}, or pass a new folder, or have it given to you (`chown {me} {prefix}`)",
        )


def _remove_created(prefix: Path, created: list[Path]) -> None:
    if created:
        safe_files.remove_dir(prefix / WORK, beneath=prefix)
    for folder in created:  # deepest first
        if not safe_files.remove_dir(folder):
            break


def install_env(lock_path: Path, env: str, prefix: Path, *, platform: str = "linux-64",
                mirrors: Mirrors | None = None, rehash: bool = False) -> InstallResult:
    prefix, created = _prepare_prefix(prefix)
    try:
        with contextlib.ExitStack() as held:
            held.push(_acquire(prefix))
            _recover(prefix)
            return _install(lock_path, env, prefix, platform, mirrors or Mirrors(), rehash)
    except BaseException as exc:
        _remove_created(prefix, created)
        if isinstance(exc, Busy):
            raise ExtforgeError(
                f"another install is running into {prefix} (pid {exc.holder})",
                "two installs into one prefix would mix their files",
                "wait for it to finish and run this again (it is then a no-op)",
            ) from None
        raise
    finally:
        # Empty once the lock is released: the prefix is left as it was, or holds just the env.
        safe_files.remove_dir(prefix / WORK, beneath=prefix)


def _acquire(prefix: Path) -> contextlib.AbstractContextManager[None]:
    """The install lock, entered. Another install removes the empty work folder when it ends,
    perhaps between this one's mkdir and open: then the folder is made again."""
    for _ in range(100):
        safe_files.make_private_dir(prefix / WORK, beneath=prefix)
        lock = exclusive_or_busy(install_lock_path(prefix))
        try:
            lock.__enter__()
        except FileNotFoundError:
            continue
        return lock
    raise ExtforgeError(f"cannot take the install lock in {prefix / WORK}", "its folder keeps vanishing",
                        "check what else writes the prefix")


def _install(lock_path: Path, env: str, prefix: Path, platform: str, mirrors: Mirrors, rehash: bool) -> InstallResult:

    start = time.monotonic()
    result = InstallResult(prefix=prefix, environment=env)
    records = locked_records(lock_path, env, platform)
    result.packages = len(records)
    if any(p.name != WORK for p in prefix.iterdir()):
        if installed_identity(prefix) == _identity(records):
            _check_existing(lock_path, env, prefix, mirrors)
            result.status = "already-installed"
            result.seconds = time.monotonic() - start
            return result
        raise ExtforgeError(
            f"prefix {prefix} is not empty and does not hold environment {env!r} of {lock_path.name}",
            "installing over other files would mix two environments",
            "pass a new or empty --prefix, or delete this one first",
        )

    make_room(cache_root(), f"installing environment {env!r} into {prefix}")
    t = time.monotonic()
    local, bad = fetch_verified(records, store_dir(), mirrors, result.cache_mismatches, None if rehash else ARCHIVE_DIGESTS)
    if bad:
        raise ExtforgeError(
            f"{len(bad)} package(s) differ from {lock_path.name}: " + "; ".join(bad),
            "their bytes changed after the environment was locked (tampering, or a file replaced on the channel)",
            "nothing was installed; restore the channel's files, or re-lock if the change is intended",
            exit_code=EXIT_FINDINGS,
        )
    result.archives_checked = check_archives({record_sha256(r): local[r.file_name] for r in records})
    refs = [PackageRef(r.name.normalized, r.file_name, r.url, record_sha256(r), r.size or None) for r in records]
    cache = rattler_pkgs_dir()
    manifests, _ = manifests_for(refs, prefix, local, extracted={r.file_name: extracted.entry_dir(cache, r.file_name) for r in records})
    _check_prefix_length(prefix, manifests)
    _check_interpreter_alone(manifests, lock_path)
    result.timings["fetch_verify"] = time.monotonic() - t

    pinned = [Pinned.from_record(r) for r in records]
    originals = {}
    for r in records:
        originals[r.file_name] = (r.url, r.channel)
        r.url = local[r.file_name].as_uri()
    staging = prefix / WORK / f"staging-{os.getpid()}"
    t = time.monotonic()
    # Not beside rattler's link: a thread holding the GIL (decoding these records) slows it more.
    trusted, recorded = ({}, {}) if rehash else extracted.recall(records, cache, manifests)
    result.timings["cache_recall"] = time.monotonic() - t
    try:
        _write_journal(prefix, staging, None)
        bad_files, found, hashed = _link_and_check(records, staging, prefix, cache, manifests, trusted, result)
        if bad_files:
            # The extracted cache (perhaps shared, on NFS) gave other files than the packages the
            # lock names: drop those entries so rattler extracts them again from the verified archives.
            dropped = _drop_cache_entries(cache, records, bad_files)
            result.cache_mismatches += [f"{f} (from {', '.join(dropped) or 'no cache entry found'}, extracted again)" for f in bad_files]
            # Every file hashed: a removed file's inode number may come back with a new one.
            bad_files, found, hashed = _link_and_check(records, staging, prefix, cache, manifests, {}, result)
            if bad_files:
                raise ExtforgeError(
                    f"installed files differ from the packages in {lock_path.name}: " + "; ".join(bad_files[:20]),
                    f"the package cache {cache} gives other files than the verified packages, even after re-extracting",
                    f"nothing was installed; remove {cache} (it is rebuilt) and check who can write it",
                    exit_code=EXIT_FINDINGS,
                )
        t = time.monotonic()
        staged = found | hashed
        python_sha256 = next((record_sha256(r) for r in records if r.name.normalized == PYTHON), "")
        # One thread beside this one places python and waits for its compile while this one writes the records.
        with ThreadPoolExecutor(1) as aside:
            compiling = aside.submit(_byte_compile, staging, prefix, manifests, python_sha256, staged, rehash)
            tr = time.monotonic()
            # Only a file hashed here that is a hard link (of the cache's copy, which check_files
            # made sure of) can add to the records; the placeholder files are copies.
            if any(st.st_nlink > 1 for st, _ in hashed.values()):
                extracted.remember(records, cache, manifests, staged, recorded)
            _restore_urls(staging / "conda-meta", originals, {r.file_name: r.url for r in records})
            result.timings["record"] = time.monotonic() - tr
            written, result.modules_checked = compiling.result()
            result.timings["bytecode"] = time.monotonic() - t
        _move_into(staging, prefix)
    finally:
        _forget(prefix, staging)
    write_receipt(Receipt(str(prefix), str(lock_path.resolve()), env, pinned, written, str(cache)))
    result.seconds = time.monotonic() - start
    return result


def _check_existing(lock_path: Path, env: str, prefix: Path, mirrors: Mirrors) -> None:
    """An install over a prefix that already holds the locked packages: verified, not assumed."""
    from ..machine import detect
    from .node import NodeFacts

    report = verify_prefix(prefix, lock_path=lock_path, env=env, mirrors=mirrors, node=NodeFacts(glibc=detect().glibc))
    findings = [f for c in report.checks if c.name in ("packages", "files", "unowned") for f in c.findings]
    if findings:
        raise ExtforgeError(
            f"prefix {prefix} holds {env!r} of {lock_path.name} but its files differ: " + "; ".join(findings[:5])
            + (f"; and {len(findings) - 5} more" if len(findings) > 5 else ""),
            "its files were changed after it was installed; installing over them would keep the changes",
            f"nothing was changed; see `extforge verify {prefix} --env {env} --lock {lock_path}`, then install into a "
            "new prefix or delete this one and install again",
            exit_code=EXIT_FINDINGS,
        )


def _check_prefix_length(prefix: Path, manifests: dict[str, dict]) -> None:
    """A binary file holds its build prefix as a fixed-size C string: a longer prefix cannot be
    patched in (rattler fails deep inside the install). Refuse it first, naming the limit."""
    binary = [(len(entry[3].encode()), name, entry[0]) for name, body in manifests.items()
              for entry in body["paths"] if entry[3] and entry[4] == "binary"]
    if not binary:
        return
    limit, name, path = min(binary)
    length = len(str(prefix).encode())
    if length > limit:
        raise ExtforgeError(
            f"prefix {prefix} is {length} characters long; these packages allow at most {limit}",
            f"{name}'s {path} (and other binary files) hold the build prefix in a {limit}-byte placeholder, "
            "which the prefix's path must fit into",
            f"install into a shorter path (at most {limit} characters)",
        )


def _check_interpreter_alone(manifests: dict[str, dict], lock_path: Path) -> None:
    clashes = interpreter_clashes(manifests)
    if clashes:
        name, path = clashes[0]
        more = f" (and {len(clashes) - 1} more path(s) of python's)" if len(clashes) > 1 else ""
        raise ExtforgeError(
            f"{name} ships {path}, a file of the python package's interpreter{more}",
            "rattler may keep that package's copy in place of python's: install would byte-compile with it, and "
            "every user of the environment would run it as python",
            f"nothing was installed; drop {name} from the environment in {lock_path.name}, or rebuild it without {path}",
            exit_code=EXIT_FINDINGS,
        )


def _byte_compile(staging: Path, prefix: Path, manifests: dict[str, dict], python_sha256: str,
                  staged: dict[str, tuple[os.stat_result, str]], rehash: bool) -> tuple[dict[str, list], int]:
    """Byte-compile with the python package's interpreter, placed apart from the other packages'
    files for the time it runs; the .pyc it wrote, as the install record keeps them, and how many
    sources it was sent. A source
    whose shipped .pyc the interpreter found current before, as found now (extracted.bytecode_keys),
    is not sent to it again (unless `rehash`)."""
    body = manifests.get(PYTHON)
    if body is None:
        return {}, 0
    owned = owned_paths(manifests)
    sources = sorted(p for p in owned if p.startswith("lib/python3") and p.endswith(".py"))
    tag, known = ("", set()) if rehash else extracted.recall_bytecode(python_sha256)
    keys = extracted.bytecode_keys(sources, tag, staged) if tag else {}
    own = staging / WORK
    try:
        safe_files.make_private_dir(own, beneath=prefix, exist_ok=False)
    except FileExistsError:
        raise ExtforgeError(f"a package ships {WORK}/, the name of install's own folder in the prefix",
                            "install places python's interpreter there to byte-compile: that package's files would be "
                            "in its reach", "nothing was installed; rebuild that package without it",
                            exit_code=EXIT_FINDINGS) from None
    send = [s for s in sources if keys.get(s) not in known]
    try:
        python = _place_interpreter(staging, own / PYTHON, manifests, owned, prefix)
        done = compile_bytecode(staging, prefix, send, python) if python else None
    finally:
        safe_files.remove(own, beneath=prefix)
    if done is None:
        return {}, 0
    if done.tag:
        keys = keys if done.tag == tag else extracted.bytecode_keys(sources, done.tag, staged)
        extracted.remember_bytecode(python_sha256, done.tag, known if done.tag == tag else set(),
                                    {keys[s] for s in done.current | done.invalid if s in keys})
    return done.written, len(send)


def _place_interpreter(staging: Path, root: Path, manifests: dict[str, dict], owned: set[str], prefix: Path) -> Path | None:
    """The python package's interpreter under root, of staging's files, whose bytes _link_and_check
    found to be the package's (no other package ships them): its symbolic links as its payload gives
    them, hard links of its files, and for each folder of python's interpreter alone (the standard
    library's packages, lib-dynload: no path of another package's, nor python's site-packages, lies
    under it: `owned` holds every package's paths) a symbolic link to staging's folder, in which
    _link_and_check found no file that no package owns. Its executable, None if the package has
    none. A hard link of each of its 1,932 files, placed and removed at every install, was most of
    the byte-compile step's time."""
    rows = [row for row in manifests[PYTHON]["paths"] if interpreter_path(row[0])]
    interpreter = {row[0] for row in rows}
    shared: set[str] = set()  # the folders that hold a path of another package's (or site-packages)
    for folder in {path.rpartition("/")[0] for path in owned - interpreter}:
        while folder and folder not in shared:
            shared.add(folder)
            folder = folder.rpartition("/")[0]
    alone: dict[str, str | None] = {}  # a row's folder: its outermost folder of python's alone, if any
    for path in interpreter:
        folder = path.rpartition("/")[0]
        if folder not in alone:
            alone[folder] = _outermost_alone(staging, folder, shared)
    whole = {f for f in alone.values() if f is not None}
    placed = [row for row in rows if alone[row[0].rpartition("/")[0]] is None]
    safe_files.hard_links(staging, root, [row[0] for row in placed if row[1] == "hardlink"], beneath=prefix)
    safe_files.symlinks(root, [*((f, str(staging / f)) for f in sorted(whole)),
                               *((row[0], row[6]) for row in placed if row[1] == "softlink" and row[6])], beneath=prefix)
    python = root / "bin" / "python"
    return python if os.path.lexists(python) else None


def _outermost_alone(staging: Path, folder: str, shared: set[str]) -> str | None:
    """The outermost of folder and the folders above it that no other package's path lies under
    and that is a folder in staging (not a link), None if there is none."""
    parts = folder.split("/") if folder else []
    for depth in range(1, len(parts) + 1):
        outer = "/".join(parts[:depth])
        if outer not in shared:
            try:
                return outer if stat.S_ISDIR(os.lstat(staging / outer).st_mode) else None
            except OSError:
                return None
    return None


def _move_into(staging: Path, prefix: Path) -> None:
    """Rename staging's entries into the (empty) prefix, conda-meta last: a prefix without
    conda-meta is not an environment yet. The journal lets the next run undo a killed move."""
    names = sorted((p.name for p in staging.iterdir()), key=lambda n: (n == "conda-meta", n))
    _write_journal(prefix, staging, names)
    moved = []
    try:
        for name in names:
            safe_files.rename(staging / name, prefix / name, beneath=prefix)
            moved.append(name)
    except BaseException:
        _remove_entries(prefix, moved)
        raise


def _write_journal(prefix: Path, staging: Path, moving: list[str] | None) -> None:
    body = {"journal": _JOURNAL_SCHEMA, "prefix": str(prefix), "staging": staging.name, "moving": moving}
    safe_files.write_atomic(prefix / WORK / JOURNAL, sign(body), mode=0o600, beneath=prefix)


def _forget(prefix: Path, staging: Path) -> None:
    """Remove a staging folder, then the journal: one that could not go stays vouched for."""
    safe_files.remove_quietly(staging, beneath=prefix)
    if not os.path.lexists(staging):
        safe_files.remove_quietly(prefix / WORK / JOURNAL, beneath=prefix)


def _untrusted(path: Path, why: str) -> ExtforgeError:
    work = path.parent
    return ExtforgeError(
        f"refusing to act on {path}: {why}",
        "install deletes what a killed install left (a staging folder, a move cut short) only as its own journal "
        f"names it, written for this prefix and signed with your key in {trust_dir()}; nothing was deleted",
        f"check what is in {work} and in the prefix; if no install of yours was killed there, "
        f"remove {work} yourself (`rm -r {work}`) and run again",
    )


def _journal(prefix: Path) -> dict | None:
    """The journal a killed install of this user left for this prefix; None if there is none."""
    path = prefix / WORK / JOURNAL
    try:
        raw = safe_files.read_bytes(path, limit=1 << 20, beneath=prefix)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _untrusted(path, f"it cannot be read ({exc.strerror})") from None
    body = verify_signed(raw)
    if body is None or body.get("journal") != _JOURNAL_SCHEMA:
        raise _untrusted(path, "it carries no valid MAC of yours (another user, another extforge cache or an edit wrote it)")
    if body.get("prefix") != str(prefix):
        raise _untrusted(path, f"it was written for another prefix ({body.get('prefix')})")
    staging, moving = body.get("staging"), body.get("moving")
    if not (isinstance(staging, str) and staging.startswith("staging-") and "/" not in staging
            and (moving is None or isinstance(moving, list) and all(isinstance(n, str) for n in moving))):
        raise _untrusted(path, "it is not a journal this version of extforge writes")
    return body


def _remove_entries(prefix: Path, names: list[str]) -> None:
    for name in names:
        if "/" in name or name in ("", ".", "..", WORK):
            continue  # the journal is read back: only plain names of prefix entries
        safe_files.remove_quietly(prefix / name, beneath=prefix)


def _recover(prefix: Path) -> None:
    """Remove what a killed install left in the prefix (the lock is held: no install runs).
    A journal naming a move without conda-meta in the prefix is a move cut short: its entries
    are undone. Everything is checked before anything is removed."""
    work = prefix / WORK
    journal = _journal(prefix)
    staging = journal["staging"] if journal is not None else None
    for name in safe_files.names(work, beneath=prefix):
        if name.startswith("staging-") and name != staging:
            raise _untrusted(work / name, "no journal of an install of yours names it")
    if journal is None:
        return
    if journal["moving"] is not None and not (prefix / "conda-meta").exists():
        _remove_entries(prefix, journal["moving"])
    _forget(prefix, work / journal["staging"])


def _new_staging(staging: Path, prefix: Path) -> None:
    """An empty staging folder inside the prefix's work folder: it inherits a setgid prefix's
    group, and so does everything installed into it."""
    safe_files.remove(staging, beneath=prefix)
    safe_files.make_dirs(staging, beneath=prefix)


def _link_and_check(records: list, staging: Path, prefix: Path, cache: Path, manifests: dict[str, dict],
                    trusted: dict[extracted.Inode, extracted.Verified],
                    result: InstallResult) -> tuple[list[str], dict[str, tuple[os.stat_result, str]],
                                                    dict[str, tuple[os.stat_result, str]]]:
    """Install into staging, then check what landed there against the packages' own manifests
    (hashing what `trusted` does not vouch for); the paths (relative) that differ from them or
    that no package owns, and the files found as expected (check_files): those `trusted`
    vouched for, and those hashed."""
    from rattler import install

    t = time.monotonic()
    _new_staging(staging, prefix)
    try:
        asyncio.run(
            install(
                records,
                staging,
                cache_dir=cache,
                alternative_target_prefix=prefix,
                show_progress=False,
                execute_link_scripts=False,
            )
        )
    except Exception as exc:  # rattler's InstallerError and friends
        # A full disk or a name too long, deep in rattler's chain of causes: said as for any command.
        if (code := re.search(r"\(os error (\d+)\)", str(exc))) is not None:
            known = from_os_error(OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(staging)))
            if known is not None:
                raise known from exc
        raise ExtforgeError(f"installing into {prefix} failed: {exc}", type(exc).__name__,
                            "nothing was installed; run again with -vv for rattler's detail") from exc
    owned = owned_paths(manifests)
    if CACHEDIR_TAG not in owned:
        # rattler marks every prefix as a cache; backup tools would then skip the environment.
        safe_files.remove(staging / CACHEDIR_TAG, beneath=prefix)
    result.timings["link"] = result.timings.get("link", 0.0) + time.monotonic() - t
    t = time.monotonic()
    report = VerifyReport(prefix=prefix)
    _, found, hashed = check_files(staging, manifests, None, report, prefix=prefix, trusted=trusted)
    clobbered, bad_clobbered = _clobbered_files(staging, manifests, prefix)
    unowned = [f for f in _unowned_files(staging, owned) if f not in clobbered]
    result.timings["check"] = result.timings.get("check", 0.0) + time.monotonic() - t
    result.files_hashed += report.files_hashed
    return sorted(set(report.bad_files) | set(unowned) | set(bad_clobbered)), found, hashed


CLOBBERS = "__clobbers__"


def _clobbered_files(root: Path, manifests: dict[str, dict], prefix: Path) -> tuple[set[str], list[str]]:
    """Files rattler set aside when two packages ship the same path (every nvidia-*-cu12 wheel
    has its own nvidia/__init__.py): `__clobbers__/<package>/<path>` is that package's copy.
    Those whose package lists the path, and the ones among them whose bytes differ from it."""
    found: set[str] = set()
    bad: list[str] = []
    base = root / CLOBBERS
    if not base.is_dir():
        return found, bad
    for pkg_dir in base.iterdir():
        body = manifests.get(pkg_dir.name)
        if body is None:
            continue
        want = dict(expected_paths(body, prefix))
        for dirpath, _dirs, files in os.walk(pkg_dir):
            for name in files:
                path = Path(dirpath, name)
                rel = path.relative_to(pkg_dir).as_posix()
                if rel not in want:
                    continue
                found.add(f"{CLOBBERS}/{pkg_dir.name}/{rel}")
                if want[rel] is not None and sha256_file(path) != want[rel]:
                    bad.append(f"{CLOBBERS}/{pkg_dir.name}/{rel}")
    return found, bad


CACHEDIR_TAG = "CACHEDIR.TAG"


def _unowned_files(root: Path, owned: set[str]) -> list[str]:
    out = []
    skip = len(str(root)) + 1
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = dirpath[skip:]
        if rel_dir == "conda-meta":
            dirnames[:] = []
            continue
        above = f"{rel_dir}/" if rel_dir else ""
        out += [p for f in filenames if (p := above + f) not in owned]
    return out


def _drop_cache_entries(cache: Path, records: list, rel_paths: list[str]) -> list[str]:
    """Remove the extracted cache folders that hold any of rel_paths; their names."""
    # A set-aside copy (__clobbers__/<package>/<path>) came from that package's <path>.
    rels = [rel.split("/", 2)[2] if rel.startswith(f"{CLOBBERS}/") and rel.count("/") >= 2 else rel for rel in rel_paths]
    dropped = []
    for r in records:
        entry = extracted.entry_dir(cache, r.file_name)
        if any(os.path.lexists(entry / rel) for rel in rels):
            safe_files.remove_quietly(entry, beneath=cache)
            safe_files.remove_quietly(cache / f"{entry.name}.lock", beneath=cache)
            dropped.append(entry.name)
    return dropped


# rattler writes each conda-meta record as indented JSON: a top-level key starts a line indented by
# two spaces (a string holds no raw newline, a nested one is indented further).
_URL_KEY = '\n  "url": "'
_DECODER = json.JSONDecoder()


def _restore_urls(meta: Path, originals: dict[str, tuple[str, str]], local: dict[str, str]) -> None:
    """Record the channel URLs of the lock in conda-meta, not the local store's paths (`local`:
    the URL rattler was given, by file name). Only the url's string is replaced: torch's record
    is 4.5 MB of JSON, decoded and encoded again in 0.1-0.3 s. A record of another layout is
    decoded whole."""
    to_lock = {local[fn]: url for fn, (url, _channel) in originals.items() if fn in local}
    for f in meta.glob("*.json"):
        text = f.read_bytes().decode()
        start = text.find(_URL_KEY) + len(_URL_KEY) - 1
        try:
            url, end = _DECODER.raw_decode(text, start) if start >= len(_URL_KEY) - 1 else ("", -1)
        except ValueError:
            url, end = "", -1
        if isinstance(url, str) and url in to_lock:
            text = f"{text[:start]}{json.dumps(to_lock[url])}{text[end:]}"
        else:
            d = json.loads(text)
            if d.get("fn") not in originals:
                continue
            d["url"], d["channel"] = originals[d["fn"]]
            text = json.dumps(d) + "\n"
        # 0644: rattler writes them 0600, and every job's user reads them to verify. Not synced:
        # a crash throws the staging folder away (rattler syncs none of its files). Removed first:
        # a rename over it made ext4 (auto_da_alloc) start writing the new file out at once.
        safe_files.remove(f)
        safe_files.write_atomic(f, text.encode(), mode=0o644, sync=False)
