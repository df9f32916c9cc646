"""Every entry of a prefix accounted for, in one walk.

An entry is accounted for when a locked package puts it there (same kind, same link target,
mode bits no wider than the package's payload gives: no setuid, setgid or write bit added),
when `extforge install` wrote it and recorded it (byte-compiled .pyc, see receipt.py), or when
it is one of the few files tools write (TOOL_FILES, with the reason). Everything else is a
finding naming the path: a planted .pyc, a library deep in site-packages, an activate.d script,
a file swapped for a symbolic link.

Besides kind, link target, mode and digest, each entry is checked as `rpm -V` does and more:
its owner is the prefix's owner and its group the prefix's or the owner's own (a file someone
else owns is theirs to change after verify); a file carries no file capabilities or other
`security.*` attribute (a `cap_setuid+ep` python gives anyone root) and no ACL; a file's other
names (hard links) are only the package cache's copy it was linked from (another name outside
the prefix lets its writer change the file after verify); and the tool files accepted without
a digest hold what their tool writes. These come from the one lstat per entry the walk makes
anyway, plus, for a file that changed since the last clean run, its extended attributes.

The walk is made cheap on a second run by the record of the last clean run (verify.py): a
folder whose (mtime, ctime, inode, mode) are those recorded has the same entries (creating,
removing or renaming an entry changes its folder's mtime and ctime, and ctime cannot be set
back), so it is not listed again; each recorded entry is still lstat'ed, since a write into a
file or a chmod shows only in the entry's own ctime. When every recorded entry is as recorded
(`unchanged`), nothing else is needed: not even the packages' manifests.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ExtforgeError
from ..safe_files import read_bytes
from .trust import PYTHON, Expected, interpreter_path

# Files tools write into a prefix besides the packages' own, and why each is expected.
TOOL_FILES = {
    "conda-meta/history": "rattler's install log (read by conda, never run)",
    "CACHEDIR.TAG": "rattler marks a prefix it installs as a cache for backup tools (extforge install removes it)",
    ".extforge-install.json": "the install record, where the prefix's folder could not take it (receipt.py)",
    ".extforge/install.lock": "extforge install's lock (kept in the prefix, which its installer can write); "
                              "present while an install, or its check of an existing prefix, runs",
}
# conda-meta/<package>.json: the install's record of each package, compared with the lock by the packages check.
RECORD_PACKAGE = "conda-meta record (checked against the lock)"
INSTALL = "extforge install"
CLOBBERS = "__clobbers__"

# The mode bits a folder may have that no package gives (folders are implicit in packages):
# group write and the setgid bit of a prefix that has it (inherited by every folder made in it).
_DIR_DANGER = stat.S_ISUID | stat.S_ISGID | 0o002
_FILE_DANGER = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o002


def expectations(manifest_entries: dict[str, list[tuple[str, Expected]]], written: dict[str, list],
                 record_names: list[str]) -> tuple[dict[str, Expected], set[str]]:
    """What the prefix should hold: {relative path: Expected}, and the paths that may be absent
    (rattler's set-aside copies of a path two packages ship, and the folders above them)."""
    expect: dict[str, Expected] = {}
    owners: dict[str, list[Expected]] = {}  # each package's entry for the path
    for entries in manifest_entries.values():
        for rel, e in entries:
            expect[rel] = e
            owners.setdefault(rel, []).append(e)
    optional: dict[str, Expected] = {}
    for rel, copies in owners.items():
        if len(copies) > 1:  # rattler keeps one in place and sets the others aside under __clobbers__/<package>/
            # A path of python's interpreter holds python's copy only: another package's would run as python.
            python = next((e for e in copies if e.package == PYTHON and interpreter_path(rel)), None)
            kept = python or expect[rel]
            others = [e for e in copies if e.package != kept.package]
            expect[rel] = kept._replace(also=tuple(e.package for e in others),
                                        also_sha256=() if python else tuple(e.sha256 for e in others if e.sha256))
            for e in copies:
                optional[f"{CLOBBERS}/{e.package}/{rel}"] = e
    for rel, (sha, mode) in written.items():
        expect[rel] = Expected("file", INSTALL, sha, mode)
    for fn in record_names:
        expect[f"conda-meta/{fn}.json"] = Expected("file", RECORD_PACKAGE)
    _add_folders(expect, list(expect))
    # Tool files may be absent, and so may a folder only they live in (the install lock's).
    for rel, why in TOOL_FILES.items():
        expect[rel] = Expected("file", why)
    absent_ok = {rel for rel in optional if rel not in expect} | set(TOOL_FILES)
    for rel, e in optional.items():
        expect.setdefault(rel, e)
    before = set(expect)
    _add_folders(expect, sorted(absent_ok))
    absent_ok |= set(expect) - before
    return expect, absent_ok


def _add_folders(expect: dict[str, Expected], rels: list[str]) -> None:
    for rel in rels:
        while "/" in rel:
            rel = rel.rsplit("/", 1)[0]
            if rel in expect:
                break
            expect[rel] = Expected("dir", "")


def key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode]


def unchanged(root: str, previous: dict[str, list], trusted: set[str]) -> bool:
    """Every entry of the last clean record still as recorded (and old enough to be believed):
    the folders hold the same names, the files the same bytes and modes."""
    if not previous or len(trusted) != len(previous):
        return False
    lstat = os.lstat
    for rel, k in previous.items():
        try:
            st = lstat(f"{root}/{rel}" if rel != "." else root)
        except OSError:
            return False
        if k[2] != st.st_ctime_ns or k[3] != st.st_ino or k[0] != st.st_size or k[1] != st.st_mtime_ns or k[4] != st.st_mode:
            return False
    return True


@dataclass
class Walk:
    owned: list[str] = field(default_factory=list)  # findings about what packages (or install) put there
    unowned: list[str] = field(default_factory=list)  # findings about entries nothing accounts for
    to_hash: dict[str, list[int]] = field(default_factory=dict)  # files whose content must be hashed, with their key
    record: dict[str, list] = field(default_factory=dict)  # the entries for the next record (hashed files are added after hashing)
    unchanged: int = 0
    listed: int = 0  # folders read (changed since the record, or no record)


@dataclass(frozen=True)
class Owner:
    """Who may own the prefix's entries: the prefix folder's owner, with its group or the
    owner's own primary group (a prefix that is not setgid gives new entries the latter)."""

    uid: int
    gids: frozenset[int]

    @classmethod
    def of(cls, st: os.stat_result) -> Owner:
        try:
            primary = {pwd.getpwuid(st.st_uid).pw_gid}
        except KeyError:
            primary = set()
        return cls(st.st_uid, frozenset({st.st_gid, *primary}))


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _ownership(rel: str, st: os.stat_result, owner: Owner) -> str | None:
    if st.st_uid != owner.uid:
        return (f"owner changed: {rel} is owned by {user_name(st.st_uid)}, the prefix by {user_name(owner.uid)} "
                "(its owner can change it after verify)")
    if st.st_gid not in owner.gids:
        return f"group changed: {rel} has group {st.st_gid}, the prefix's entries have {', '.join(map(str, sorted(owner.gids)))}"
    return None


# SELinux labels every file of a host that runs it: a label is no privilege of its own.
_HARMLESS_XATTRS = {"security.selinux"}


def _xattr_problems(rel: str, path: str) -> list[str]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return []  # a filesystem without extended attributes
    out = []
    for attr in sorted(names):
        if attr == "security.capability":
            out.append(f"file capabilities: {rel} carries security.capability (running it grants privileges, "
                       "as setuid would; no package sets them)")
        elif attr.startswith("security.") and attr not in _HARMLESS_XATTRS:
            out.append(f"security attribute: {rel} carries {attr} (no package sets it)")
        elif attr in ("system.posix_acl_access", "system.posix_acl_default"):
            out.append(f"ACL: {rel} carries an access control list (it can let others write what its mode does not show)")
    return out


def _cache_copies(rel: str, e: Expected, linked: dict[str, str]) -> list[str]:
    """The package cache's copies a prefix file may have been hard-linked from: its package's,
    and where several packages ship the path, each of theirs (rattler keeps any one in place)."""
    if rel.startswith(f"{CLOBBERS}/"):
        rel = rel.split("/", 2)[2]  # __clobbers__/<package>/<path> is that package's <path>
    return [f"{linked[name]}/{e.source or rel}" for name in (e.package, *e.also) if name in linked]


def _link_problem(rel: str, st: os.stat_result, e: Expected, linked: dict[str, str]) -> str | None:
    if st.st_nlink < 2:
        return None
    for copy in _cache_copies(rel, e, linked):
        try:
            cst = os.lstat(copy)
        except (PermissionError, FileNotFoundError):
            # The installer's private cache seen by a job user, or a copy pruned since (the file's
            # other names are then other prefixes installed from it): the second name cannot be
            # told apart. The file is still its prefix owner's, with no mode or ACL letting
            # anyone else write it (checked before).
            return None
        except OSError:
            cst = None
        # The cache's copy, and perhaps other prefixes installed from the same cache.
        if cst is not None and (cst.st_dev, cst.st_ino) == (st.st_dev, st.st_ino):
            return None
    return (f"hard-linked: {rel} has {st.st_nlink} names, one outside the prefix that is not the package cache's copy "
            "(whoever can write that name can change the file after verify)")


_HISTORY_LINE = re.compile(rb"(==> .* <==|#.*|[+-]\S+|)")
_PID = re.compile(rb"\d{0,20}\n?")
_CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"


def _tool_problem(rel: str, path: str) -> str | None:
    """Whether a tool file holds what its tool writes (verify accepts it without a digest)."""
    limit = {".extforge/install.lock": 32, "CACHEDIR.TAG": 1024, "conda-meta/history": 16 << 20}.get(rel, 64 << 20)
    try:
        data = read_bytes(Path(path), limit=limit)
    except (OSError, ExtforgeError) as exc:
        return f"tool file changed: {rel} cannot be read as the tool's file ({getattr(exc, 'what', exc)})"
    ok = {
        ".extforge/install.lock": lambda: bool(_PID.fullmatch(data)),
        "CACHEDIR.TAG": lambda: data.startswith(_CACHEDIR_SIGNATURE),
        "conda-meta/history": lambda: all(_HISTORY_LINE.fullmatch(line) for line in data.splitlines()),
        ".extforge-install.json": lambda: data.startswith(b"{"),
    }[rel]()
    return None if ok else f"tool file changed: {rel} does not hold what {TOOL_FILES[rel].split(' (')[0]} writes"


def _file_problems(rel: str, st: os.stat_result, e: Expected, path: str, linked: dict[str, str]) -> list[str]:
    """What a regular file changed since the last clean run may carry besides its bytes."""
    out = _xattr_problems(rel, path)
    if (bad := _link_problem(rel, st, e, linked)) is not None:
        out.append(bad)
    if rel in TOOL_FILES and (bad := _tool_problem(rel, path)) is not None:
        out.append(bad)
    return out


def walk(root: str, expect: dict[str, Expected], absent_ok: set[str], previous: dict[str, list], trusted: set[str],
         linked: dict[str, str] | None = None) -> Walk:
    """Account for every entry under root. previous: the last clean record ({rel: key}) made
    against the same expectations; trusted: those of its entries old enough to be believed;
    linked: {package name: its folder in the package cache} (its files' other names)."""
    linked = linked or {}
    out = Walk()
    children: dict[str, list[str]] = {}
    for rel in previous:
        parent, _, name = rel.rpartition("/")
        children.setdefault(parent, []).append(name)
    try:
        root_st = os.lstat(root)
    except OSError as exc:
        out.owned.append(f"unreadable: the prefix itself ({exc.strerror})")
        return out
    inherit = root_st.st_mode & stat.S_ISGID
    owner = Owner.of(root_st)
    if finding := _dir_mode("the prefix folder", root_st, inherit):
        out.owned.append(finding)
    seen: set[str] = set()
    blocked: list[str] = []  # folders whose contents could not be compared: nothing below them is called missing
    stack = [("", root_st)]
    while stack:
        d, st = stack.pop()
        path = f"{root}/{d}" if d else root
        rec = previous.get(d or ".")
        out.record[d or "."] = key(st)
        if rec is not None and (d or ".") in trusted and rec == key(st):
            names = children.get(d, [])
        else:
            out.listed += 1
            try:
                names = os.listdir(path)
            except OSError as exc:
                out.owned.append(f"unreadable: {d or '.'}/ ({exc.strerror})")
                blocked.append(d)
                continue
        for name in names:
            rel = f"{d}/{name}" if d else name
            if rel == ".":
                continue
            try:
                cst = os.lstat(f"{path}/{name}")
            except FileNotFoundError:
                continue  # reported as missing below when something should be there
            except OSError as exc:
                out.owned.append(f"unreadable: {rel} ({exc.strerror})")
                blocked.append(rel)
                continue
            seen.add(rel)
            e = expect.get(rel)
            if e is None:
                out.unowned += unowned_findings(rel, cst, f"{path}/{name}")
                continue
            if (bad := _check_entry(rel, cst, e, f"{path}/{name}", inherit) or _ownership(rel, cst, owner)) is not None:
                out.owned.append(bad)
                blocked.append(rel)
                continue
            if e.kind == "dir":
                stack.append((rel, cst))
                continue
            k = key(cst)
            if rel in trusted and previous.get(rel) == k:  # as the last clean run saw it, attributes included
                out.record[rel] = k
                out.unchanged += e.kind == "file" and e.sha256 is not None
                continue
            if e.kind == "file" and (bad_attrs := _file_problems(rel, cst, e, f"{path}/{name}", linked)):
                out.owned += bad_attrs
            elif e.kind == "file" and e.sha256 is not None:
                out.to_hash[rel] = k
            else:
                out.record[rel] = k
    missing = sorted(r for r in expect.keys() - seen if r not in absent_ok)
    for rel in missing:
        if not any(rel.startswith(f"{b}/") for b in blocked):
            out.owned.append(f"missing: {rel} ({expect[rel].package or 'folder'})")
    out.unowned.sort()
    return out


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    return ("file" if stat.S_ISREG(m) else "link" if stat.S_ISLNK(m) else "dir" if stat.S_ISDIR(m)
            else "special file")


_NOUN = {"file": "a file", "link": "a symbolic link", "dir": "a folder", "special file": "a special file (device, fifo or socket)"}


def _check_entry(rel: str, st: os.stat_result, e: Expected, path: str, inherit: int) -> str | None:
    kind = _kind(st)
    owner = e.package or "the folders of the packages"
    if kind != e.kind:
        got = f"{_NOUN[kind]} to {os.readlink(path)}" if kind == "link" else _NOUN[kind]
        return f"replaced: {rel} is {got}, {owner} has {_NOUN[e.kind]} there"
    if kind == "link":
        target = os.readlink(path)
        if e.target is not None and target != e.target:
            return f"link changed: {rel} -> {target}, {owner} has -> {e.target}"
        return None
    if kind == "dir":
        return _dir_mode(rel, st, inherit)
    mode = stat.S_IMODE(st.st_mode)
    wider = mode & ~e.mode if e.mode is not None else mode & _FILE_DANGER
    if wider:
        gives = f"{owner} gives {e.mode:04o}" if e.mode is not None else "no package gives setuid, setgid or world write"
        return f"mode widened: {rel} is {mode:04o}, {gives}"
    return None


def _dir_mode(rel: str, st: os.stat_result, inherit: int) -> str | None:
    mode = stat.S_IMODE(st.st_mode)
    if mode & _DIR_DANGER & ~inherit:
        return f"mode widened: {rel} is a folder with mode {mode:04o} (setuid, setgid or writable by anyone)"
    return None


# Python runs these at every start, from any folder on sys.path (.pth only from site folders).
_STARTUP = {"sitecustomize", "usercustomize"}


def unowned_findings(rel: str, st: os.stat_result, path: str) -> list[str]:
    """An entry nothing accounts for and, for a folder, every file below it (links not followed)."""
    out = [unowned_finding(rel, st, path)]
    if stat.S_ISDIR(st.st_mode):
        for dirpath, dirs, files in os.walk(path):
            sub = rel + dirpath[len(path):]
            for name in sorted(files + [d for d in dirs if os.path.islink(f"{dirpath}/{d}")]):
                try:
                    out.append(unowned_finding(f"{sub}/{name}", os.lstat(f"{dirpath}/{name}"), f"{dirpath}/{name}"))
                except OSError as exc:
                    out.append(f"not from any package: {sub}/{name} (unreadable: {exc.strerror})")
    return out


def unowned_finding(rel: str, st: os.stat_result, path: str) -> str:
    """`not from any package: REL (why it matters)`."""
    parts = rel.split("/")
    name = parts[-1]
    stem = name.split(".", 1)[0]
    on_import_path = (len(parts) == 3 and parts[0] == "lib" and parts[1].startswith("python3")) or \
        (len(parts) == 4 and parts[0] == "lib" and parts[1].startswith("python3") and parts[2] in ("site-packages", "lib-dynload"))
    kind = _kind(st)
    if name.endswith(".pyc"):
        why = "byte code Python runs instead of its source"
    elif on_import_path and (name.endswith(".pth") or stem in _STARTUP):
        why = "runs code at every python start"
    elif on_import_path or (parts[0] == "lib" and len(parts) > 2 and parts[1].startswith("python3") and name.endswith(".py")):
        why = "importable module"
    elif parts[:3] in (["etc", "conda", "activate.d"], ["etc", "conda", "deactivate.d"]):
        why = "runs at every activation"
    elif parts[0] == "bin":
        why = "on the PATH of every job"
    elif ".so" in name:
        why = "a shared library the loader may pick up"
    else:
        why = _NOUN[kind]
    if kind == "link":
        why += f", a symbolic link to {os.readlink(path)}"
    return f"not from any package: {rel} ({why})"
