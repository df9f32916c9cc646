"""Where the mirror's CUDA toolkits come from: NVIDIA's wheels (13.x), Debian's packages (12.x,
11.x), or a toolkit installed on this machine. Downloads are unpacked once into the extforge
cache, keyed by what was downloaded, so a warm mirror run fetches nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import paths, shared_read
from ..cuda_rule import Offer, choose
from ..errors import ExtforgeError
from ..hashing import sha256_file as hash_file
from ..locking import exclusive
from ..ui import log
from .cuda_toolkit import CUDART_LIBS, INCLUDE, LIB, NVCC_TOOLS, TARGET, Toolkit, package_of
from .hashing import sha256_file, stat_identity, text_identity
from .inputs import MirrorInputs
from .toolchain import parse_nvcc_version

# Part of every unpacked tree's cache key: bump it when what the *_target functions keep changes.
LAYOUT = 2
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class DebianToolkit:
    suite: str
    version: str  # the nvcc version, 12.4.131
    packages: tuple[str, ...]


# Debian's non-free CUDA toolkits. nvidia-cuda-dev carries every header and static library
# (934 MB for 12.4); only its headers and libcudart are kept.
DEBIAN = {
    "12.4": DebianToolkit(
        "trixie",
        "12.4.131",
        ("nvidia-cuda-toolkit", "nvidia-cuda-dev", "libcudart12", "libthrust-dev", "libcub-dev", "libcu++-dev"),
    ),
}
# NVIDIA's wheels hold a complete nvcc from CUDA 13.0 on (the 12.x ones lack nvcc and cicc).
WHEEL_MINORS = {13: range(6)}
WHEEL_EXTRAS = "nvcc,cudart,cccl,cublas,cusparse,cusolver,curand,cufft"


def offers() -> list[Offer]:
    """Toolkit versions this machine can package without one being installed."""
    found = [Offer(v, "debian") for v in DEBIAN]
    for major, minors in WHEEL_MINORS.items():
        found += [Offer(f"{major}.{m}", "wheels") for m in minors]
    return found


def toolkit_for(torch_cuda: str, cuda_home: str | None = None) -> Toolkit:
    """The toolkit to build for a torch with CUDA `torch_cuda`: the one at `cuda_home` if given
    (it must fit, by the same rule), else the best offer by cuda_toolkit.choose."""
    if cuda_home:
        host = from_host(cuda_home)
        choose(torch_cuda, [Offer(host.short, "host")])
        return host
    return fetch(choose(torch_cuda, offers()))


def toolkits_dir() -> Path:
    return paths.own_area("toolkits")


def fetch(offer: Offer) -> Toolkit:
    if offer.source == "debian":
        return from_debian(DEBIAN[offer.version])
    if offer.source == "wheels":
        return from_wheels(offer.version)
    raise ValueError(offer.source)


# ------------------------------------------------------------------ a layout tree in the cache


# toolkit.json and a request's note: a few hundred bytes each, as _cached_tree and from_wheels write them.
_META_LIMIT = 1 << 20


def _strings(*fields: str) -> Callable[[object], dict[str, Any]]:
    """A parser of a JSON object whose `fields` are strings."""
    def parse(data: object) -> dict[str, Any]:
        if not isinstance(data, dict) or not all(isinstance(data.get(f), str) for f in fields):
            raise ValueError(f"it is not an object whose {', '.join(fields)} are strings")
        return data
    return parse


def _tree_toolkit(root: Path, source: str) -> Toolkit:
    meta = shared_read.read_json(root / "toolkit.json", _strings("version", "origin", "identity"), limit=_META_LIMIT)
    files = {}
    tree = root / "tree"
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / name
            files[p.relative_to(tree).as_posix()] = p
    return Toolkit(meta["version"], source, meta["origin"], files, meta["identity"])


def _cached_tree(key: str, build: Callable[[Path], dict[str, Any]]) -> Path:
    """`toolkits/<key>`, made by build(tree_dir) -> meta dict once; concurrent runs wait."""
    root = toolkits_dir() / key
    with exclusive(toolkits_dir() / f"{key}.lock"):
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            (root / "tree").mkdir(parents=True)
            meta = build(root / "tree")
            (root / "toolkit.json").write_text(json.dumps(meta, indent=1))
            (root / ".complete").touch()
    paths.mark_used(root)
    return root


# ------------------------------------------------------------------ NVIDIA's wheels (13.x)


def wheel_target(member: str) -> str | None:
    """Where a member of an nvidia/cuXX wheel goes in the layout (None: not needed)."""
    parts = member.split("/", 3)
    if len(parts) < 4 or parts[0] != "nvidia" or member.endswith("/"):
        return None
    top, rest = parts[2], parts[3]
    if top == "bin":
        return None if rest == "nvcc.profile" else f"bin/{rest}"
    if top == "nvvm":
        return f"nvvm/{rest}"
    if top == "include":
        return f"{INCLUDE}/{rest}"
    if top == "lib" and rest.startswith(CUDART_LIBS):
        return f"{LIB}/{rest}"
    return None


def from_wheels(short: str, python: str = sys.executable) -> Toolkit:
    """CUDA `short` from NVIDIA's wheels. The wheels (1.2 GB for 13.0, mostly math libraries of
    which only headers are kept) are deleted once unpacked; a note maps the request to its tree."""
    req = f"cuda-toolkit[{WHEEL_EXTRAS}]=={short}.*"
    note = toolkits_dir() / "wheels" / f"{text_identity(str(LAYOUT), req)[:16]}.json"
    with exclusive(note.with_suffix(".lock")):
        try:
            key = shared_read.read_json(note, _strings("key"), limit=_META_LIMIT)["key"]
        except (FileNotFoundError, shared_read.Refused):
            key = ""  # fetched again: the note is written anew below
        if re.fullmatch(r"wheels-[0-9a-f]{24}", key):
            root = toolkits_dir() / key
            if (root / ".complete").exists():
                paths.mark_used(root)
                return _tree_toolkit(root, "wheels")
        with tempfile.TemporaryDirectory(dir=toolkits_dir()) as tmp:
            start = time.monotonic()
            proc = subprocess.run(
                [python, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", tmp, req],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise ExtforgeError(
                    f"pip could not download the CUDA {short} toolkit wheels",
                    (proc.stderr.strip().splitlines() or ["no output"])[-1],
                    f"check the package index pip uses; or pass --cuda-home DIR with a CUDA {short} toolkit "
                    "installed here",
                )
            wheels = sorted(Path(tmp).glob("nvidia_*.whl"))
            fetch = {"download_seconds": round(time.monotonic() - start, 1),
                     "download_bytes": sum(w.stat().st_size for w in wheels)}
            key = "wheels-" + text_identity(str(LAYOUT), *sorted(hash_file(w) for w in wheels))[:24]

            def build(tree: Path) -> dict:
                start = time.monotonic()
                nvcc_version = ""
                for whl in wheels:
                    with zipfile.ZipFile(whl) as zf:
                        for info in zf.infolist():
                            rel = wheel_target(info.filename)
                            if rel is None:
                                continue
                            out = tree / rel
                            out.parent.mkdir(parents=True, exist_ok=True)
                            out.write_bytes(zf.read(info))
                            out.chmod((info.external_attr >> 16) & 0o777 or 0o644)
                    if whl.name.startswith("nvidia_cuda_nvcc-"):
                        nvcc_version = whl.name.split("-")[1]
                if not nvcc_version:
                    raise ExtforgeError(f"pip's answer to {req} holds no nvidia-cuda-nvcc wheel", "",
                                        "check the package index pip uses")
                names = ", ".join(w.name.split("-")[0] + " " + w.name.split("-")[1] for w in wheels)
                fetch["unpack_seconds"] = round(time.monotonic() - start, 1)
                return {"version": nvcc_version, "origin": f"NVIDIA's wheels ({names})", "identity": key,
                        "fetch": fetch}

            root = _cached_tree(key, build)
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps({"request": req, "key": key}))
    return _tree_toolkit(root, "wheels")


# ------------------------------------------------------------------ Debian's packages (12.x, 11.x)


def debian_target(member: str) -> str | None:
    """Where a file of Debian's CUDA packages goes in the layout (None: not needed)."""
    m = member.removeprefix("./")
    lib = "usr/lib/x86_64-linux-gnu/"
    tk = "usr/lib/nvidia-cuda-toolkit/"
    if m == f"{tk}bin/nvcc":  # the real driver; usr/bin/nvcc is a wrapper script
        return "bin/nvcc"
    if m.startswith(f"{tk}bin/crt/"):
        return "bin/" + m[len(tk) + 4 :]
    if m == f"{tk}bin/cicc":
        return "nvvm/bin/cicc"
    if m.startswith(f"{tk}libdevice/"):
        return "nvvm/libdevice/" + m[len(tk) + 10 :]
    if m.startswith("usr/bin/") and m[8:] in NVCC_TOOLS and m[8:] != "nvcc":
        return m.replace("usr/bin/", "bin/")
    if m.startswith("usr/include/") and len(m) > 12:
        return f"{INCLUDE}/{m[12:]}"
    if m.startswith(lib) and m[len(lib):].startswith(CUDART_LIBS):
        return f"{LIB}/{m[len(lib):]}"
    if m.startswith(f"{lib}stubs/"):
        return f"{LIB}/stubs/{m[len(lib) + 6:]}"
    return None


class Apt:
    """apt-get with a private sources list and state: the system's apt configuration is untouched."""

    def __init__(self, suite: str):
        self.root = toolkits_dir() / "apt" / suite
        self.suite = suite

    def options(self) -> list[str]:
        r = self.root
        return [
            "-o", f"Dir::Etc::SourceList={r / 'sources.list'}",
            "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={r / 'lists'}",
            "-o", f"Dir::Cache={r / 'cache'}",
            "-o", "Debug::NoLocking=1",
        ]  # fmt: skip

    def run(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(["apt-get", *self.options(), *args], capture_output=True, text=True, cwd=cwd)
        if proc.returncode != 0:
            raise ExtforgeError(
                f"apt-get {args[0]} for Debian {self.suite} failed",
                (proc.stderr.strip().splitlines() or ["no output"])[-1],
                f"check that {DEBIAN_MIRROR} is reachable (or copy the toolkit's .deb files' cache "
                f"{toolkits_dir()} from a machine where it is); or pass --cuda-home DIR",
            )
        return proc.stdout

    def update(self) -> None:
        (self.root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (self.root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (self.root / "sources.list").write_text(
            f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {self.suite} main contrib non-free\n"
        )
        self.run("update")

    def show(self, package: str) -> dict[str, str]:
        proc = subprocess.run(["apt-cache", *self.options(), "show", package], capture_output=True, text=True)
        fields: dict[str, str] = {}
        for line in proc.stdout.split("\n\n")[0].splitlines():
            if ":" in line and not line.startswith(" "):
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        return fields


def from_debian(d: DebianToolkit) -> Toolkit:
    apt = Apt(d.suite)
    with exclusive(toolkits_dir() / f"apt-{d.suite}.lock"):
        if not (apt.root / "lists").is_dir() or not any((apt.root / "lists").glob("*Packages*")):
            apt.update()
        records = [apt.show(p) for p in d.packages]
        if not all(r.get("SHA256") for r in records) or not records[0].get("Version", "").startswith(d.version):
            apt.update()
            records = [apt.show(p) for p in d.packages]
    missing = [p for p, r in zip(d.packages, records, strict=True) if not r.get("SHA256")]
    if missing or not records[0]["Version"].startswith(d.version):
        raise ExtforgeError(
            f"Debian {d.suite} does not offer nvidia-cuda-toolkit {d.version}",
            f"missing: {', '.join(missing)}" if missing else f"it offers {records[0]['Version']}",
            "update extforge.mirror.cuda_sources.DEBIAN to what the suite offers now, or pass --cuda-home DIR",
        )
    key = "debian-" + text_identity(str(LAYOUT), *(r["SHA256"] for r in records))[:24]

    def build(tree: Path) -> dict:
        debs: dict[str, int] = {}
        stats: dict[str, Any] = {"debs": debs, "download_bytes": 0}
        with tempfile.TemporaryDirectory(dir=toolkits_dir()) as tmp:
            start = time.monotonic()
            apt.run("download", *(f"{p}={r['Version']}" for p, r in zip(d.packages, records, strict=True)),
                    cwd=Path(tmp))
            stats["download_seconds"] = round(time.monotonic() - start, 1)
            start = time.monotonic()
            for deb in sorted(Path(tmp).glob("*.deb")):
                debs[deb.name] = deb.stat().st_size
                stats["download_bytes"] += deb.stat().st_size
                _unpack_deb(deb, tree)
            stats["unpack_seconds"] = round(time.monotonic() - start, 1)
        return {
            "version": d.version,
            "origin": f"Debian {d.suite} non-free nvidia-cuda-toolkit {records[0]['Version']}",
            "identity": key,
            "fetch": stats,
        }

    return _tree_toolkit(_cached_tree(key, build), "debian")


def _unpack_deb(deb: Path, tree: Path) -> None:
    """Extract the members the layout needs from a .deb (dpkg-deb streams its data archive)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            rel = debian_target(member.name)
            if rel is None or member.isdir():
                continue
            out = tree / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            if member.issym():
                target = member.linkname
                # Debian links across its own tree (cuda.h -> ../../../include/cuda.h); keep only
                # links inside one folder, which stay valid in the layout.
                if "/" in target:
                    continue
                out.unlink(missing_ok=True)
                out.symlink_to(target)
            elif member.isfile():
                src = tar.extractfile(member)
                assert src is not None
                with out.open("wb") as fh:
                    shutil.copyfileobj(src, fh)
                out.chmod(member.mode & 0o777 | 0o644)
    if proc.wait() != 0:
        raise ExtforgeError(f"could not unpack {deb.name}", f"dpkg-deb exited with {proc.returncode}",
                            f"delete {deb.parent} and retry")


# ------------------------------------------------------------------ a toolkit installed here


def host_target(rel: str) -> str | None:
    """Where a file of an installed toolkit goes in the layout; `rel` is relative to CUDA_HOME,
    with include/ and lib/ as seen through targets/x86_64-linux (lib64/ on older toolkits)."""
    if rel.startswith("bin/"):
        name = rel[4:]
        return rel if name in NVCC_TOOLS or name.startswith("crt/") else None
    if rel.startswith(("nvvm/bin/", "nvvm/libdevice/")):
        return rel
    if rel.startswith((f"{INCLUDE}/", *(f"{LIB}/{n}" for n in (*CUDART_LIBS, "stubs/")))):
        return rel
    return None


def _host_dirs(home: Path) -> dict[str, Path]:
    """Layout folder -> the real folder of an installed toolkit (whose targets/ may be links)."""
    target = home / TARGET
    return {
        "bin": home / "bin",
        "nvvm": home / "nvvm",
        INCLUDE: (target / "include" if (target / "include").is_dir() else home / "include").resolve(),
        LIB: (target / "lib" if (target / "lib").is_dir() else home / "lib64").resolve(),
    }


def from_host(cuda_home: str) -> Toolkit:
    """The toolkit at `cuda_home`, its files copied into the packages (no link to the host)."""
    home = Path(cuda_home).resolve()
    nvcc = home / "bin" / "nvcc"
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    version = parse_nvcc_version(out)
    if not version:
        raise ExtforgeError(
            f"{cuda_home} is not a CUDA toolkit",
            f"{nvcc} is missing or does not print its version",
            "pass the folder that holds bin/nvcc (e.g. --cuda-home /usr/local/cuda)",
        )
    files: dict[str, Path] = {}
    for layout_dir, real in _host_dirs(home).items():
        for dirpath, dirnames, filenames in os.walk(real):
            for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
                p = Path(dirpath) / name
                rel = host_target(f"{layout_dir}/{p.relative_to(real).as_posix()}")
                if rel:
                    # A link out of its folder would leave the package pointing at this host.
                    files[rel] = p.resolve() if p.is_symlink() and "/" in os.readlink(p) else p
    identity = stat_identity([str(p), rel, ""] for rel, p in sorted(files.items()))
    log.info("host toolkit %s: %d files from %s", version, len(files), home)
    return Toolkit(version, "host", f"the CUDA {version} toolkit in {home}", files, identity)


def add_wheel_headers(tk: Toolkit, inputs: MirrorInputs) -> Toolkit:
    """Math-library headers a host toolkit lacks (a CI image's toolkit may ship nvcc without
    cublas/cusparse headers), from the nvidia wheels the mirrored torch depends on."""
    if any(package_of(rel) == "cuda-libraries-dev" for rel in tk.files):
        return tk
    wheels = [a.wheel for a in inputs.artifacts.values() if a.wheel is not None and a.name.startswith("nvidia-")]
    if wheels:
        key = "headers-" + text_identity(str(LAYOUT), *sorted(sha256_file(w) for w in wheels))[:24]

        def build(tree: Path) -> dict:
            for whl in wheels:
                with zipfile.ZipFile(whl) as zf:
                    for member in zf.namelist():
                        rel = wheel_target(member)
                        if rel and package_of(rel) == "cuda-libraries-dev":
                            out = tree / rel
                            out.parent.mkdir(parents=True, exist_ok=True)
                            out.write_bytes(zf.read(member))
            return {"version": tk.version, "origin": "the nvidia wheels of the mirrored torch", "identity": key}

        found = _tree_toolkit(_cached_tree(key, build), "wheels").files
    else:
        found = {}
        for site in {a.installed["site_dir"] for a in inputs.artifacts.values() if a.installed}:
            for inc in sorted(Path(site).glob("nvidia/*/include")):
                for p in inc.rglob("*"):
                    rel = f"{INCLUDE}/{p.relative_to(inc).as_posix()}"
                    if p.is_file() and package_of(rel) == "cuda-libraries-dev":
                        found[rel] = p
    added = {rel: p for rel, p in found.items() if rel not in tk.files}
    if added:
        log.info("%s has no math-library headers; %d taken from torch's nvidia wheels", tk.origin, len(added))
    files = tk.files | added
    identity = text_identity(tk.identity, stat_identity([str(p), rel, ""] for rel, p in sorted(added.items())))
    return Toolkit(tk.version, tk.source, tk.origin, files, identity)
