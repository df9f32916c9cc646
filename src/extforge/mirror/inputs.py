"""Where mirrored artifacts come from: an installed environment, a folder of wheels, or pip."""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .. import paths, safe_files, shared_read
from ..environment.accounting import user_name
from ..environment.trust import sign, verify_signed
from ..errors import ExtforgeError
from ..locking import exclusive
from ..ui import log
from .deps import DistInfo

PROBE_SCRIPT = Path(__file__).with_name("_probe_env.py")


@dataclass
class Interpreter:
    """The CPython that becomes the channel's `python` package (a venv's base interpreter)."""

    version: str  # 3.11.7
    executable: str
    base_prefix: str
    stdlib: str
    include: str
    ldlibrary: str
    libdir: str
    multiarch: str
    debian_site: bool
    prefix: str = ""
    site_packages: list[str] = field(default_factory=list)

    @property
    def short(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def site_rel(self) -> str:
        return f"lib/python{self.short}/site-packages"

    @property
    def python_rel(self) -> str:
        return f"bin/python{self.short}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interpreter:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Artifact:
    """One Python distribution available to mirror: a wheel file or an installed dist."""

    name: str  # canonical
    display_name: str
    version: str
    requires_dist: list[str]
    tags: list[str]
    wheel: Path | None = None
    installed: dict[str, Any] | None = None  # the probe's record of an installed dist

    @property
    def info(self) -> DistInfo:
        return DistInfo(self.name, self.version, self.requires_dist)

    @property
    def is_pure(self) -> bool:
        return all(t.endswith("-any") for t in self.tags) if self.tags else True


@dataclass
class MirrorInputs:
    interpreter: Interpreter
    artifacts: dict[str, Artifact]
    description: str


def probe(python: str, *, dists: bool) -> dict[str, Any]:
    """Ask `python` about itself (and its installed dists) without importing anything of it."""
    cmd = [python, "-I", str(PROBE_SCRIPT)] + (["--dists"] if dists else [])
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    except FileNotFoundError as exc:
        raise ExtforgeError(
            f"python {python} does not exist",
            "the mirror packages a CPython: the one of --from-env's environment, or --python's",
            "pass an interpreter path, e.g. --from-env /path/to/venv/bin/python3 or --python /usr/bin/python3.12",
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise ExtforgeError(
            f"could not run {python} to describe its environment",
            (exc.stderr or "").strip().splitlines()[-1:][0] if exc.stderr else f"exit code {exc.returncode}",
            "check that the path is a working Python >= 3.8",
        ) from exc
    return json.loads(out.stdout)


def from_env(python: str) -> MirrorInputs:
    data = probe(python, dists=True)
    interp = Interpreter.from_json(data["python"])
    artifacts: dict[str, Artifact] = {}
    for d in data["dists"]:
        name = canonicalize_name(d["name"])
        artifacts[name] = Artifact(name, d["name"], d["version"], d["requires_dist"], d["tags"], installed=d)
    return MirrorInputs(interp, artifacts, f"the environment of {python}")


def wheel_metadata(path: Path) -> tuple[str, str, list[str], list[str]]:
    """(name, version, Requires-Dist lines, WHEEL tags) read from a wheel's dist-info."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode("utf-8", "replace"), headersonly=True)
        wheel_txt = zf.read(meta_name.replace("/METADATA", "/WHEEL")).decode()
    tags = [line.split(":", 1)[1].strip() for line in wheel_txt.splitlines() if line.startswith("Tag:")]
    return meta["Name"], meta["Version"], meta.get_all("Requires-Dist") or [], tags


def wheel_fits(filename: str, py_short: str) -> bool:
    """Whether a wheel installs on CPython `py_short` on linux-64."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    cp = "cp" + py_short.replace(".", "")
    for tag in tags:
        py_ok = tag.interpreter in (cp, "py3", f"py{py_short.replace('.', '')}") or (
            tag.abi == "abi3" and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= int(cp[3:])
        )
        abi_ok = tag.abi in (cp, "abi3", "none")
        plat_ok = tag.platform == "any" or tag.platform.endswith("x86_64") and "linux" in tag.platform
        if py_ok and abi_ok and plat_ok:
            return True
    return False


def from_wheels(wheel_dir: Path, python: str = sys.executable) -> MirrorInputs:
    if not wheel_dir.is_dir():
        raise ExtforgeError(
            f"wheel folder {wheel_dir} does not exist",
            "--from-wheels reads *.whl files from a folder",
            "pass a folder that holds torch and its dependency wheels (e.g. filled by `pip download`)",
        )
    interp = Interpreter.from_json(probe(python, dists=False)["python"])
    best: dict[str, Artifact] = {}
    for whl in sorted(wheel_dir.glob("*.whl")):
        if not wheel_fits(whl.name, interp.short):
            continue
        name, version, requires, tags = wheel_metadata(whl)
        key = canonicalize_name(name)
        if key in best and Version(best[key].version) >= Version(version):
            continue
        best[key] = Artifact(key, name, version, requires, tags, wheel=whl)
    return MirrorInputs(interp, best, f"the wheels in {wheel_dir}")


def pip_wheel_dir(requirements: list[str], py_short: str) -> Path:
    """The download folder of one request for one Python minor (wheels differ per cpXY tag)."""
    key = hashlib.sha256(json.dumps([py_short, *sorted(requirements)]).encode()).hexdigest()[:16]
    return paths.own_area("mirror") / "wheels" / key


# A download folder pip completed holds its record: the request and each wheel's sha256 and
# size, signed with this user's key (trust.sign). Only a folder of this user's that nobody else
# can write, with a record this user signed, is reused or lends its wheels; a lent or reused
# wheel is hashed first, so no file another user planted in a shared cache is ever mirrored.
COMPLETE = ".complete"
_RECORD_KIND = "mirror-wheels"
_RECORD_LIMIT = 4 << 20  # a torch request's record is ~10 KB
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Download:
    """A download folder's signed record: what it was filled for, and what pip put there."""

    python: str
    requirements: tuple[str, ...]
    wheels: dict[str, tuple[str, int]]  # file name: (sha256, size)

    def body(self) -> dict[str, Any]:
        return {"kind": _RECORD_KIND, "python": self.python, "requirements": list(self.requirements),
                "wheels": {name: list(v) for name, v in sorted(self.wheels.items())}}

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Download | None:
        python, requirements, wheels = body.get("python"), body.get("requirements"), body.get("wheels")
        if (body.get("kind") != _RECORD_KIND or not isinstance(python, str) or not isinstance(requirements, list)
                or not all(isinstance(r, str) for r in requirements) or not isinstance(wheels, dict)):
            return None
        parsed = {}
        for name, value in wheels.items():
            if not (name.endswith(".whl") and "/" not in name and isinstance(value, list) and len(value) == 2
                    and isinstance(value[0], str) and _SHA256.fullmatch(value[0])
                    and isinstance(value[1], int) and value[1] >= 0):
                return None
            parsed[name] = (value[0], value[1])
        return cls(python, tuple(requirements), parsed)


def read_download(folder: Path) -> Download | None:
    """The record of a download folder, None where there is none this user signed."""
    try:
        raw = shared_read.read_bytes(folder / COMPLETE, limit=_RECORD_LIMIT, own=True, beneath=folder.parent)
    except (FileNotFoundError, shared_read.Refused):
        return None
    body = verify_signed(raw)
    return Download.parse(body) if body is not None else None


def _open_own(name: str | Path, *, dir_fd: int | None = None, folder: bool = False) -> int | None:
    """A descriptor of the regular file (or folder) `name`, not a link, when it is this user's and
    nobody else may write it: then only this user can change what it holds. None otherwise."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_DIRECTORY if folder else 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    kind = stat.S_ISDIR if folder else stat.S_ISREG
    if kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE:
        return fd
    os.close(fd)
    return None


def _sha256_of(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _link_verified(dir_fd: int, name: str, sha256: str, size: int, dest: Path) -> bool:
    """Link the wheel `name` of the folder dir_fd (one of this user's that nobody else can write)
    as dest, if it is this user's own file and its bytes are the sha256 recorded for it."""
    fd = _open_own(name, dir_fd=dir_fd)
    if fd is None:
        return False
    try:
        if os.fstat(fd).st_size != size or _sha256_of(fd) != sha256:
            return False
        os.link(name, dest, src_dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False  # e.g. another admin's file (protected_hardlinks): the wheel is fetched instead
    finally:
        os.close(fd)
    return True


def share_wheels(wheel_dir: Path, store: Path, digests: dict[str, str]) -> int:
    """Make each wheel of a request folder (name: its sha256) a hard link into one store kept by
    sha256, so requests that share wheels (the same torch with and without extras: 3-4 GB of
    nvidia wheels) keep one copy on disk. A store entry is linked in only from a folder of this
    user's that nobody else can write, its bytes hashed again. Returns the bytes this freed."""
    freed = 0
    paths.mark_used(wheel_dir)
    for name, sha256 in sorted(digests.items()):
        wheel, kept = wheel_dir / name, store / sha256 / name
        st = wheel.lstat()
        if st.st_nlink > 1:
            paths.mark_used(kept.parent)
            continue  # already in the store
        if not os.path.lexists(kept.parent):
            kept.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        dir_fd = _open_own(kept.parent, folder=True)
        if dir_fd is None:
            continue  # another user's folder under this sha256: the wheel keeps its own copy
        try:
            if not os.path.lexists(kept):
                os.link(wheel, name, dst_dir_fd=dir_fd, follow_symlinks=False)
                continue
            tmp = wheel.with_name(name + ".link")
            tmp.unlink(missing_ok=True)
            if _link_verified(dir_fd, name, sha256, st.st_size, tmp):
                freed += st.st_size
                os.replace(tmp, wheel)
        finally:
            os.close(dir_fd)
    return freed


def any_python(filename: str) -> bool:
    """Whether a wheel is the same file for every CPython 3 (`py3-none-*`: torch's nvidia-*
    wheels), as opposed to one built for a cpXY ABI."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return all(t.abi == "none" and t.interpreter in ("py3", "py2.py3") for t in tags)


def lend_shared_wheels(wheel_dir: Path, requirements: list[str], py_short: str) -> dict[str, str]:
    """Link into `wheel_dir`, before pip runs, the any-python wheels that the complete download
    of the same request for another Python holds: pip finds them already downloaded (checked
    against the index's sha256 where the index gives one) and fetches only the rest. Rows A and
    B (torch 2.9.1 for Python 3.10 and 3.12) share 3.0 of their 4.1 GB. Lent only from this
    user's own downloads, each wheel hashed against their record (~10 s for 3 GB, against
    downloading it). Returns the wheels lent, with their sha256."""
    wanted = tuple(sorted(requirements))
    lent: dict[str, str] = {}
    # One version a project at most: drop_unchosen tells pip's choice by a second wheel.
    projects = {_project(w.name) for w in wheel_dir.glob("*.whl")}
    for other in sorted(wheel_dir.parent.iterdir()):
        dir_fd = None if other == wheel_dir else _open_own(other, folder=True)
        if dir_fd is None:
            continue
        try:
            record = read_download(other)
            if record is None or record.python == py_short or record.requirements != wanted:
                continue
            for name, (sha256, size) in sorted(record.wheels.items()):
                if (any_python(name) and _project(name) not in projects
                        and _link_verified(dir_fd, name, sha256, size, wheel_dir / name)):
                    projects.add(_project(name))
                    lent[name] = sha256
        finally:
            os.close(dir_fd)
    return lent


def drop_unchosen(wheel_dir: Path, lent: dict[str, str]) -> None:
    """Remove the lent wheels pip did not take: where this Python's resolution chose another
    version of a project (a dependency newer releases of which need a newer Python), the
    folder holds both, and from_wheels would take the newer."""
    projects: dict[str, int] = {}
    for wheel in wheel_dir.glob("*.whl"):
        name = _project(wheel.name)
        projects[name] = projects.get(name, 0) + 1
    for name in lent:
        if projects.get(_project(name), 0) > 1:
            (wheel_dir / name).unlink()


def _project(filename: str) -> str:
    try:
        return canonicalize_name(parse_wheel_filename(filename)[0])
    except InvalidWheelFilename:
        return filename


def pip_failure(stderr: str, where: Path) -> ExtforgeError:
    """pip's own reason: its ERROR: lines (what it could not find, and the versions the index has),
    or where pip itself crashed, the exception its traceback ends with; a full disk named as such."""
    # pip's closing [notice] (a newer pip exists) explains nothing.
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith("[notice]")]
    errors = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR: ") and ln != "ERROR: Exception:"]
    reason = " / ".join(e[:2000] for e in errors) if errors else (lines or ["no output"])[-1]
    # A CUDA build of torch (2.9.1+cu129) is served by PyTorch's own index, not by PyPI.
    missing = next((e.rpartition(" for ")[2] for e in errors if e.startswith("No matching distribution found for torch")), "")
    cuda = missing.partition("+")[2]
    if "No space left on device" in stderr:
        free = shutil.disk_usage(where).free / 2**30
        return ExtforgeError(
            f"the disk is full: pip could not write the wheels to mirror into {where} ({free:.1f} GiB free)",
            reason,
            "free space on that filesystem (a torch request downloads 3-4 GB of wheels once; old request "
            "folders under the mirror cache can go), or point EXTFORGE_CACHE at a larger one",
        )
    return ExtforgeError(
        "pip could not download the wheels to mirror",
        reason,
        (f"{missing} is on PyTorch's own index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/{cuda} "
         "extforge mirror ...; or " if cuda.startswith("cu") else "check the package index pip uses (pip config list), or ")
        + "use --from-wheels DIR with wheels you already have, or --from-env PYTHON with an installed torch",
    )


def _own_request_folder(wheel_dir: Path) -> None:
    """The request's download folder, made if missing; refused unless it is this user's and
    nobody else can write it (its wheels become the channel's packages)."""
    wheel_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = _open_own(wheel_dir, folder=True)
    if fd is not None:
        os.close(fd)
        return
    st = wheel_dir.lstat()
    why = (f"it is owned by {user_name(st.st_uid)}" if st.st_uid != os.geteuid() else
           f"others can write it (mode {stat.filemode(st.st_mode)})" if stat.S_ISDIR(st.st_mode) else "it is not a folder")
    raise ExtforgeError(
        f"refusing to use {wheel_dir}: {why}, not yours alone",
        "the mirror packages the wheels it finds in its download folder; someone else could have put theirs there",
        f"remove {wheel_dir} (its wheels are downloaded again) and run again",
    )


def _reusable(wheel_dir: Path, requirements: list[str], py_short: str) -> Download | None:
    """The folder's record when it is this request's and the folder holds the recorded wheels and
    no other, each a file of this user's of the recorded size that nobody else can write: then it
    holds what pip downloaded. None: pip runs."""
    record = read_download(wheel_dir)
    if (record is None or (record.python, record.requirements) != (py_short, tuple(sorted(requirements)))
            or {w.name for w in wheel_dir.glob("*.whl")} != set(record.wheels)):
        return None
    for name, (_, size) in record.wheels.items():
        st = (wheel_dir / name).lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & _OTHERS_WRITE or st.st_size != size:
            return None
    return record


def _not_yours(wheel: Path) -> ExtforgeError:
    return ExtforgeError(f"refusing to mirror {wheel}: it is not a file of yours",
                         "someone else could have put it into the download folder",
                         f"remove {wheel.parent} (its wheels are downloaded again) and run again")


def _record_download(wheel_dir: Path, requirements: list[str], py_short: str, lent: dict[str, str]) -> Download:
    """The record of a folder pip just completed: each wheel's sha256 (a lent one's known) and
    size, its write bits for others cleared (pip under umask 002 leaves them group-writable)."""
    wheels = {}
    for wheel in sorted(wheel_dir.glob("*.whl")):
        try:
            fd = os.open(wheel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            raise _not_yours(wheel) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise _not_yours(wheel)
            if st.st_mode & _OTHERS_WRITE:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_OTHERS_WRITE)
            wheels[wheel.name] = (lent.get(wheel.name) or _sha256_of(fd), st.st_size)
        finally:
            os.close(fd)
    return Download(py_short, tuple(sorted(requirements)), wheels)


def from_pip(requirements: list[str], python: str = sys.executable) -> MirrorInputs:
    """`pip download` the requirements for `python` (its native tags) into a folder keyed by the request."""
    interp = Interpreter.from_json(probe(python, dists=False)["python"])
    wheel_dir = pip_wheel_dir(requirements, interp.short)
    _own_request_folder(wheel_dir)
    # Native tags of the target python, through our own pip (`pip --python`), so that python
    # needs no pip of its own: an explicit --platform list missed wheels tagged only manylinux_2_25.
    cmd = [sys.executable, "-m", "pip", "--python", python, "download", "-q", "--only-binary=:all:",
           "-d", str(wheel_dir), *requirements]
    # Two runs asking for the same request (a prefetch and the mirror that needs it) download it
    # once: the second waits, then finds the folder complete.
    with exclusive(wheel_dir.with_name(f"{wheel_dir.name}.lock")):
        # Once a request downloaded completely its folder is reused as is: pip's resolver alone takes
        # seconds, and a warm mirror should not. Deleting the folder asks pip again.
        record = _reusable(wheel_dir, requirements, interp.short)
        downloaded = record is None
        if record is None:
            lent = lend_shared_wheels(wheel_dir, requirements, interp.short)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                for name in lent:  # a later attempt lends again, knowing what it lent
                    (wheel_dir / name).unlink(missing_ok=True)
                raise pip_failure(proc.stderr, wheel_dir)
            drop_unchosen(wheel_dir, lent)
            if taken := [wheel_dir / n for n in lent if (wheel_dir / n).exists()]:
                log.info("%d any-python wheels (%.1f GB) taken from another Python's download of this request, "
                         "not downloaded again", len(taken), sum(w.stat().st_size for w in taken) / 1e9)
            record = _record_download(wheel_dir, requirements, interp.short, lent)
        share_wheels(wheel_dir, wheel_dir.parent.parent / "wheel-store",
                     {name: sha256 for name, (sha256, _) in record.wheels.items()})
        if downloaded:
            safe_files.write_atomic(wheel_dir / COMPLETE, sign(record.body()), mode=0o644)
    inputs = from_wheels(wheel_dir, python)
    inputs.description = f"pip ({' '.join(requirements)})"
    return inputs
