"""Where mirrored artifacts come from: an installed environment, a folder of wheels, or pip."""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .. import paths
from ..errors import ExtforgeError
from ..locking import exclusive
from ..ui import log
from .deps import DistInfo
from .hashing import sha256_file

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
    return paths.cache_root() / "mirror" / "wheels" / key


def share_wheels(wheel_dir: Path, store: Path) -> int:
    """Make each wheel of a request folder a hard link into one store kept by sha256, so requests
    that share wheels (the same torch with and without extras: 3-4 GB of nvidia wheels) keep one
    copy on disk. Returns the bytes this freed."""
    freed = 0
    paths.mark_used(wheel_dir)
    for wheel in sorted(wheel_dir.glob("*.whl")):
        kept = store / sha256_file(wheel) / wheel.name  # memoized: no re-read of 3 GB per run
        if wheel.stat().st_nlink > 1:
            paths.mark_used(kept.parent)
            continue  # already in the store
        if kept.exists():
            tmp = wheel.with_name(wheel.name + ".link")
            tmp.unlink(missing_ok=True)
            os.link(kept, tmp)
            freed += wheel.stat().st_size
            os.replace(tmp, wheel)
        else:
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.link(wheel, kept)
    return freed


# What a download folder was filled for: the key of pip_wheel_dir, readable.
REQUEST_FILE = "request.json"


def _request(requirements: list[str], py_short: str) -> dict[str, Any]:
    return {"python": py_short, "requirements": sorted(requirements)}


def any_python(filename: str) -> bool:
    """Whether a wheel is the same file for every CPython 3 (`py3-none-*`: torch's nvidia-*
    wheels), as opposed to one built for a cpXY ABI."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return all(t.abi == "none" and t.interpreter in ("py3", "py2.py3") for t in tags)


def lend_shared_wheels(wheel_dir: Path, requirements: list[str], py_short: str) -> list[Path]:
    """Link into `wheel_dir`, before pip runs, the any-python wheels that the complete download
    of the same request for another Python holds: pip finds them already downloaded (checked
    against the index's sha256 where the index gives one) and fetches only the rest. Rows A and
    B (torch 2.9.1 for Python 3.10 and 3.12) share 3.0 of their 4.1 GB. Returns the links made."""
    wanted = _request(requirements, py_short)
    lent: list[Path] = []
    # One version a project at most: drop_unchosen tells pip's choice by a second wheel.
    projects = {_project(w.name) for w in wheel_dir.glob("*.whl")}
    for record in sorted(wheel_dir.parent.glob(f"*/{REQUEST_FILE}")):
        other = record.parent
        try:
            request = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if (other == wheel_dir or not (other / ".complete").exists() or request.get("python") == py_short
                or request.get("requirements") != wanted["requirements"]):
            continue
        for wheel in sorted(other.glob("*.whl")):
            if any_python(wheel.name) and _project(wheel.name) not in projects:
                try:
                    os.link(wheel, wheel_dir / wheel.name)
                except OSError:
                    continue  # another admin's file (protected_hardlinks): pip downloads it
                projects.add(_project(wheel.name))
                lent.append(wheel_dir / wheel.name)
    return lent


def drop_unchosen(wheel_dir: Path, lent: list[Path]) -> None:
    """Remove the lent wheels pip did not take: where this Python's resolution chose another
    version of a project (a dependency newer releases of which need a newer Python), the
    folder holds both, and from_wheels would take the newer."""
    projects: dict[str, int] = {}
    for wheel in wheel_dir.glob("*.whl"):
        name = _project(wheel.name)
        projects[name] = projects.get(name, 0) + 1
    for wheel in lent:
        if projects.get(_project(wheel.name), 0) > 1:
            wheel.unlink()


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


def from_pip(requirements: list[str], python: str = sys.executable) -> MirrorInputs:
    """`pip download` the requirements for `python` (its native tags) into a folder keyed by the request."""
    interp = Interpreter.from_json(probe(python, dists=False)["python"])
    wheel_dir = pip_wheel_dir(requirements, interp.short)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    complete = wheel_dir / ".complete"
    # Native tags of the target python, through our own pip (`pip --python`), so that python
    # needs no pip of its own: an explicit --platform list missed wheels tagged only manylinux_2_25.
    cmd = [sys.executable, "-m", "pip", "--python", python, "download", "-q", "--only-binary=:all:",
           "-d", str(wheel_dir), *requirements]
    # Two runs asking for the same request (a prefetch and the mirror that needs it) download it
    # once: the second waits, then finds the folder complete.
    with exclusive(wheel_dir.with_name(f"{wheel_dir.name}.lock")):
        # Once a request downloaded completely its folder is reused as is: pip's resolver alone takes
        # seconds, and a warm mirror should not. Deleting the folder asks pip again.
        if not complete.exists():
            lent = lend_shared_wheels(wheel_dir, requirements, interp.short)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                for wheel in lent:  # a later attempt lends again, knowing what it lent
                    wheel.unlink(missing_ok=True)
                raise pip_failure(proc.stderr, wheel_dir)
            drop_unchosen(wheel_dir, lent)
            if taken := [w for w in lent if w.exists()]:
                log.info("%d any-python wheels (%.1f GB) taken from another Python's download of this request, "
                         "not downloaded again", len(taken), sum(w.stat().st_size for w in taken) / 1e9)
        # Also a folder downloaded before the store existed: its copies become links.
        share_wheels(wheel_dir, paths.cache_root() / "mirror" / "wheel-store")
        (wheel_dir / REQUEST_FILE).write_text(json.dumps(_request(requirements, interp.short)))
        complete.touch()
    inputs = from_wheels(wheel_dir, python)
    inputs.description = f"pip ({' '.join(requirements)})"
    return inputs
