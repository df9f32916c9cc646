"""The install record: which locked packages `extforge install` put in a prefix, and the files it
wrote there itself (byte-compiled .pyc), kept where the prefix's writers cannot forge it.

A prefix's own conda-meta is no evidence: whoever can write the prefix rewrites it with the
files. The record lives beside the prefix (`.<name>.extforge-install.json` in its parent
folder) and is believed only when nobody but its owner and root could have written it: the
file and every folder above it are owned by root or that owner and writable by no one else
(sticky folders such as /tmp excepted), and that owner is root, the verifying user or the owner
of the prefix folder. The Slurm case: an admin installs into /nfs/envs/x (parent folder the
admin's, mode 755), each job's user verifies; a co-tenant who can write the prefix (a group
with write access) can neither write the parent folder nor make a file owned by the admin.

Byte code: install compiles every owned .py of the prefix that has no current .pyc (packages
may ship theirs) with the python package's interpreter and records each .pyc it wrote, sha256
and mode, here. Checking a .pyc against its source instead would need the same compiler (that
interpreter, whose marshal output is not byte-stable) on every verify; a planted .pyc can carry its
source's header (mtime and size), so the header proves nothing. Compiled at install, Python never needs to write a .pyc, and any other is a finding.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import safe_files
from ..errors import ExtforgeError
from ..hashing import hash_many

SCHEMA = 1
COMPILE_TIMEOUT_S = 3600
COMPILE_SCRIPT = Path(__file__).with_name("_compile.py")


@dataclass(frozen=True)
class Pinned:
    """One package as the lock pins it."""

    name: str
    version: str
    build: str
    sha256: str
    md5: str
    size: int
    url: str
    file_name: str

    @classmethod
    def from_record(cls, r: Any) -> Pinned:
        from .packages import record_sha256

        md5 = r.md5.hex() if isinstance(r.md5, bytes) else (r.md5 or "")
        return cls(r.name.normalized, str(r.version), str(r.build), record_sha256(r), str(md5), int(r.size or 0),
                   r.url, r.file_name)


@dataclass
class Receipt:
    prefix: str
    lock: str
    environment: str
    packages: list[Pinned]
    written: dict[str, list] = field(default_factory=dict)  # relative path: [sha256, mode] of files install wrote
    # The package cache rattler hard-linked the files from: verify accepts a file's second name there.
    cache: str = ""

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "prefix": self.prefix, "lock": self.lock, "environment": self.environment,
                "packages": [asdict(p) for p in self.packages], "written": self.written, "cache": self.cache}

    @classmethod
    def from_json(cls, data: dict) -> Receipt:
        return cls(data["prefix"], data["lock"], data["environment"], [Pinned(**p) for p in data["packages"]],
                   {k: list(v) for k, v in data["written"].items()}, str(data.get("cache", "")))

    def verify_command(self) -> str:
        return f"extforge verify {self.prefix} --env {self.environment} --lock {self.lock}"


INSIDE = ".extforge-install.json"


def receipt_path(prefix: Path) -> Path:
    return prefix.parent / f".{prefix.name}.extforge-install.json"


def receipt_paths(prefix: Path) -> list[Path]:
    """Where the record may be: beside the prefix, or, where its folder does not let the installer
    write (a prefix pre-created by root in root's folder), directly in the prefix; it is believed
    there only when the prefix folder itself is writable by its owner alone."""
    return [receipt_path(prefix), prefix / INSIDE]


def write_receipt(receipt: Receipt) -> Path:
    prefix = Path(receipt.prefix)
    data = json.dumps(receipt.to_json(), separators=(",", ":")).encode()
    tried = []
    for path in receipt_paths(prefix):
        try:
            # 0644: every job's user reads it; only its owner writes it
            safe_files.write_atomic(path, data, mode=0o644)
        except OSError as exc:  # a folder we may not write, or a folder in the record's place
            tried.append(f"{path}: {exc.strerror}")
            continue
        if path.parent != prefix:
            safe_files.remove(prefix / INSIDE)  # an older one, from when the folder was not writable
        return path
    raise ExtforgeError(
        f"the environment in {prefix} is installed, but its install record could not be written",
        "; ".join(tried),
        f"remove what is in the record's place, or run `extforge verify {prefix} --env {receipt.environment} "
        f"--lock {receipt.lock}` with the lock instead of the record",
    )


def _untrusted_why(path: Path, prefix: Path) -> str | None:
    """Why the record at path could have been written by someone the verifier does not trust; None if it could not."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return f"there is no install record at {path}"
    except OSError as exc:
        return f"the install record {path} cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    owner = st.st_uid
    try:
        prefix_owner = prefix.lstat().st_uid
    except OSError:
        prefix_owner = -1
    if owner not in (0, os.getuid(), prefix_owner):
        return f"{path} is owned by uid {owner}, neither root, you, nor the prefix's owner"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.filemode(st.st_mode)})"
    for folder in path.parents:
        fst = folder.lstat()
        if fst.st_uid not in (0, owner):
            return f"the folder {folder} above it is owned by uid {fst.st_uid}, who could replace it"
        if fst.st_mode & 0o022 and not fst.st_mode & stat.S_ISVTX:
            return f"the folder {folder} above it is writable by others (mode {stat.filemode(fst.st_mode)})"
    return None


def find_receipt(prefix: Path) -> tuple[Receipt | None, str]:
    """The prefix's install record when it can be trusted, else None and why not."""
    candidates = [(path, _untrusted_why(path, prefix)) for path in receipt_paths(prefix)]
    trusted = [path for path, why in candidates if why is None]
    if not trusted:
        present = [why for path, why in candidates if os.path.lexists(path)]
        return None, str((present or [candidates[0][1]])[0])
    path = trusted[0]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read())
        receipt = Receipt.from_json(data) if data.get("schema") == SCHEMA else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"the install record {path} is not readable ({exc})"
    if receipt is None:
        return None, f"the install record {path} has another schema (written by another extforge version)"
    if receipt.prefix != str(prefix):
        return None, f"the install record {path} names another prefix ({receipt.prefix})"
    return receipt, ""


@dataclass
class Compiled:
    """What the byte-compile step reported: the interpreter's cache tag, the sources whose .pyc it
    took as it is, those it cannot compile, and {relative path: [sha256, mode]} of each .pyc it wrote."""

    tag: str = ""
    current: set[str] = field(default_factory=set)
    invalid: set[str] = field(default_factory=set)
    written: dict[str, list] = field(default_factory=dict)


def compile_bytecode(staging: Path, prefix: Path, sources: list[str], python: Path) -> Compiled:
    """Byte-compile the sources (relative .py paths on the prefix's import path) with `python`, the
    python package's interpreter as install placed it, apart from the files of the other packages
    (code objects name their final path; a .pyc Python would take as it is, shipped by the package,
    is left alone). Owned .pyc files too where compiled again: a package's .pyc that its installed
    source did not match (the build compiled it before the source got its packaged mtime), else
    Python would rewrite it at the first import. The record vouches for each in place of the package."""
    if not sources:
        return Compiled()
    # It runs as the installing user (conda and pixi compile too). -I: no user site, no PYTHON*
    # variable (none is passed either, nor LD_LIBRARY_PATH); -S: no site module, so no `.pth`
    # file or sitecustomize runs; -B: Python itself writes nothing besides what the script compiles.
    try:
        out = subprocess.run(
            [str(python), "-I", "-S", "-B", str(COMPILE_SCRIPT), str(staging), str(prefix)],
            input="\n".join(str(staging / s) for s in sources), capture_output=True, text=True, cwd=staging,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}, timeout=COMPILE_TIMEOUT_S, check=False,
        ).stdout  # files that do not compile (test data in some packages) get no .pyc; Python cannot import them either
    except OSError:
        return Compiled()  # a Python this machine cannot run (another platform's): nothing compiled, nothing recorded
    except subprocess.TimeoutExpired as exc:
        # What it compiled is recorded; modules left over are compiled by Python where it can write.
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
    return _reported(out, staging)


def _reported(out: str, staging: Path) -> Compiled:
    """The compile script's report, read as data: only paths inside staging count."""
    done = Compiled()
    wrote = []
    base = f"{staging}/"
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word == "tag":
            done.tag = rest
        elif rest.startswith(base) and "/../" not in rest and word in ("current", "invalid", "wrote"):
            if word == "wrote":
                wrote.append(Path(rest))
            else:
                (done.current if word == "current" else done.invalid).add(rest[len(base):])
    hashes = hash_many(wrote)
    done.written = {p.relative_to(staging).as_posix(): [h, stat.S_IMODE(p.lstat().st_mode)]
                    for p, h in sorted(hashes.items()) if isinstance(h, str)}
    return done
