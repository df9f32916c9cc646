"""`extforge recipe new`: a recipe folder for a torch extension's PyPI sdist, from what the sdist
says about itself, never by running it.

The facts come from the archive's files read as data: PKG-INFO (name, version, summary, home
page, license, Requires-Dist), pyproject.toml (build requirements, dependencies) and setup.py
read with `ast` (the names and sources of its CUDAExtension/CppExtension calls, install_requires,
packages). setup.py is never executed: torch extensions' setup.py imports torch, probes nvcc and
downloads prebuilt wheels. What cannot be read that way (a name setup.py computes, a requirement
only for some platforms) is not guessed: it goes to the list the command prints.
"""

from __future__ import annotations

import ast
import email.message
import email.parser
import io
import itertools
import json
import lzma
import posixpath
import re
import sys
import tarfile
import tomllib
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from ruamel.yaml import YAML

from .. import downloads
from ..errors import ExtforgeError
from . import build_layer

PYPI = "https://pypi.org/pypi"  # the JSON API's root; a site's PyPI proxy serves the same API under its own
EXTENSION_CALLS = ("CUDAExtension", "CppExtension")
# setup()'s keywords that stand in for PKG-INFO in an archive of upstream's tree (a git archive has none).
SETUP_METADATA = ("name", "version", "description", "url", "license")
# A package's `__version__ = "1.1.0"` (fast-hadamard-transform's setup.py reads its version from there).
VERSION_LINE = re.compile(r'''(?m)^__version__\s*=\s*["']([A-Za-z0-9.+!_-]+)["']''')
# Installed for every build by the recipe shape below; upstream's own mention adds nothing.
HOST_BASE = ("python", "pip", "setuptools", "wheel", "packaging", "ninja", "pytorch")
# Build tools that run at build time only; a runtime requirement on them is upstream's setup
# habit (flash-attn and causal-conv1d list ninja), not something the installed package uses.
BUILD_ONLY = {"ninja", "setuptools", "wheel", "pip"}
# PyPI names whose conda-forge package is named otherwise; others keep their normalized name.
CONDA_NAMES = {"torch": "pytorch", "tables": "pytables", "opencv-python": "opencv", "opencv-python-headless": "opencv"}
# Top-level folders that find_packages() picks up in many sdists but are not the product.
# The packages are built for linux-64: markers about the platform are decided; markers about the
# python are not (the channel's variants choose it).
LINUX_X86_64 = {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                "extra": ""}
PYTHON_MARKERS = ("python_version", "python_full_version", "implementation", "platform_python_implementation")
COMPILED = {".cu", ".cpp", ".cc", ".cxx", ".c"}
# An environment variable setup.py reads: os.getenv("X"), os.environ.get("X"), os.environ["X"].
ENV_READ = re.compile(r"""os\.(?:getenv\(|environ\.get\(|environ\[)\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
# Trove classifiers that name one SPDX license (a BSD or GPL classifier names a family, not one).
LICENSE_CLASSIFIERS = {"MIT License": "MIT", "Apache Software License": "Apache-2.0", "ISC License (ISCL)": "ISC",
                       "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0", "The Unlicense (Unlicense)": "Unlicense"}
# The first line of a LICENSE file that names one SPDX license, where PKG-INFO names none
# (fast-hadamard-transform's classifier says only "BSD License"; its LICENSE, "BSD 3-Clause License").
LICENSE_HEADINGS = {"BSD 3-Clause License": "BSD-3-Clause", "BSD 2-Clause License": "BSD-2-Clause", "MIT License": "MIT"}
# Modules whose PyPI project is named otherwise (what a test file imports -> what to mirror).
# A test file's `from X... import` or `import X, Y as Z` line (relative imports are the tests' own).
IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)(?:\.\w+)*[ \t]+import\b|import[ \t]+([^\n#]*))", re.MULTILINE)
IMPORT_NAMES = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python"}
NOT_PACKAGES = {"tests", "test", "benchmarks", "benchmark", "docs", "examples", "build", "csrc", "scripts"}
# What the index and the sdist say goes into a recipe only in these shapes: a name or URL with a
# newline, a quote or `${{` would write YAML or Jinja of its own into the recipe.
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
URL = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/?#@!&()*+,;=%-]+")
SHA256 = re.compile(r"[0-9a-f]{64}")
CONDA_SPEC = re.compile(r"[a-z0-9][a-z0-9._-]*(?: [A-Za-z0-9.*+!<>=~,_-]+)?")
JINJA = ("${{", "{%", "{#", "#{{")
# torch op registrations in C++ sources: pyg's `RegisterOperators().op("torch_cluster::fps", ...)`,
# and `TORCH_LIBRARY(ns, m) { m.def("op(...) -> ...") }`.
IDENTIFIER = "[A-Za-z_][A-Za-z0-9_]*"
OP_REGISTRATION = re.compile(rf'\.op\(\s*"({IDENTIFIER})::({IDENTIFIER})')
TORCH_LIBRARY = re.compile(rf"TORCH_LIBRARY(?:_FRAGMENT)?\(\s*({IDENTIFIER})\s*,\s*({IDENTIFIER})\s*\)")
# Reading the sdist: an index page, and each metadata file of the archive, is read into memory
# whole (a 1.5 GiB PKG-INFO in a 7 MB sdist took 3.2 GB), and tarfile keeps every member's header.
MAX_INDEX_PAGE = 64 * 2**20
MAX_MEMBER = 8 * 2**20
MAX_MEMBERS = 200_000


@dataclass(frozen=True)
class Sdist:
    filename: str
    url: str
    sha256: str
    size: int | None = None  # bytes, where the index says


@dataclass(frozen=True)
class Extension:
    name: str
    kind: str  # CUDAExtension or CppExtension
    sources: tuple[str, ...] | None  # None: setup.py computes the list


@dataclass(frozen=True)
class OnlyIf:
    """setup.py's `ext_modules=get_extensions() if CONDITION else []`."""

    line: int
    condition: str
    names: frozenset[str]  # the names the condition reads


@dataclass
class SetupFacts:
    """What setup.py says, read without running it."""

    extensions: list[Extension] = field(default_factory=list)
    install_requires: list[str] | None = None
    packages: list[str] | None = None  # a literal packages=[...]
    find_exclude: list[str] | None = None  # packages=find_packages(exclude=...): its patterns
    archs: list[str] = field(default_factory=list)  # sm_XX of -gencode/-arch flags setup.py passes itself
    switches: list[str] = field(default_factory=list)  # environment variables it reads to build (X_FORCE_BUILD)
    globbed: list[str] = field(default_factory=list)  # folders whose sources it globs (`glob.glob(osp.join(d, "*.cpp"))`)
    reads: list[str] = field(default_factory=list)  # every environment variable it reads
    only_if: OnlyIf | None = None  # ext_modules=... if CONDITION else []
    metadata: dict[str, str] = field(default_factory=dict)  # setup()'s literal name, version, description, url, license
    unnamed: int = 0  # extension calls whose name setup.py computes
    computed_names: list[str] = field(default_factory=list)  # what to say of each, unless they are op libraries
    undecided: list[str] = field(default_factory=list)


@dataclass
class SdistFacts:
    name: str
    version: str
    summary: str | None = None
    homepage: str | None = None
    license: str | None = None
    requires: list[str] = field(default_factory=list)
    requires_from: str = ""  # which file named them
    build_requires: list[str] = field(default_factory=list)
    package_dirs: list[str] = field(default_factory=list)  # top-level folders holding __init__.py
    top_level: list[str] | None = None  # setuptools' egg-info/top_level.txt: the names the package installs
    setup: SetupFacts | None = None
    undecided: list[str] = field(default_factory=list)
    compiled: list[str] = field(default_factory=list)  # the archive's C/C++/CUDA sources, below its top folder
    download_url: str | None = None  # PKG-INFO's Download-URL (pyg: the GitHub archive of the release's tag)
    texts: dict[str, str] = field(default_factory=dict)  # the files read (archive_files), by path below the top folder
    test_files: list[str] = field(default_factory=list)  # upstream's test files the sdist holds


def source_url(name: str, filename: str) -> str:
    """PyPI's /packages/source/ address of an sdist: a redirect to the file, derived from its name
    alone (a recipe should rather name the index's immutable files.pythonhosted.org URL)."""
    project = canonicalize_name(name)
    return f"https://files.pythonhosted.org/packages/source/{project[0]}/{project}/{filename}"


def sdist_from_pypi_json(data: Mapping[str, object], name: str, version: str) -> Sdist:
    """The release's sdist in PyPI's JSON answer (`urls`: its files, sha256 included)."""
    files = data.get("urls")
    found = [f for f in files if isinstance(f, dict) and f.get("packagetype") == "sdist"] if isinstance(files, list) else []
    if not found:
        raise ExtforgeError(f"{name} {version} has no sdist on PyPI", "only wheels were uploaded for this release",
                            "pick a version with a source archive, or pass --sdist FILE with one you have")
    try:
        entry = found[0]
        filename, url, sha256 = str(entry["filename"]), str(entry["url"]), str(entry["digests"]["sha256"])
    except (KeyError, TypeError) as exc:
        raise ExtforgeError(f"the index's answer for {name} {version} lacks the sdist's {exc}",
                            "an index serving PyPI's JSON API names each file's filename, url and digests.sha256",
                            "pass --sdist FILE (and --url URL) instead") from exc
    size = entry.get("size")
    sdist = Sdist(filename, url, sha256.lower(), size if type(size) is int and size > 0 else None)
    why = f"its size {size!r} is not a number of bytes" if size is not None and sdist.size is None else sdist_problem(sdist)
    if why is not None:
        raise ExtforgeError(f"the index's answer for {name} {version} names an sdist recipe new cannot use", why,
                            "check --index names the index meant, or pass --sdist FILE (and --url URL)")
    return sdist


def sdist_problem(sdist: Sdist) -> str | None:
    """Why the sdist's file name, URL or sha256 cannot go into a recipe (or a path), or None."""
    if (why := downloads.file_name_reason(sdist.filename)) is not None:
        return f"its file name: {why}"
    if not URL.fullmatch(sdist.url):
        return f"its URL {sdist.url!r} is not an http(s) or file URL of plain characters"
    if (why := downloads.file_name_reason(urlparse(sdist.url).path.rsplit("/", 1)[-1])) is not None:
        return f"its URL ends in no file name: {why}"
    if not SHA256.fullmatch(sdist.sha256):
        return f"its sha256 {sdist.sha256!r} is not 64 hex digits"
    return None


def pypi_sdist(name: str, version: str, index: str = PYPI) -> Sdist:
    """The release's sdist from the index's JSON API: the release's own page, else the project's
    page, whose `releases` list every version's files (some proxies serve only the latter)."""
    project = f"{index.rstrip('/')}/{canonicalize_name(name)}"
    try:
        return sdist_from_pypi_json(_json(f"{project}/{version}/json"), name, version)
    except ExtforgeError as first:
        try:
            releases = _json(f"{project}/json").get("releases")
        except ExtforgeError:
            raise first from None
        files = releases.get(version) if isinstance(releases, dict) else None
        if files is None:
            raise first from None
        return sdist_from_pypi_json({"urls": files}, name, version)


def _json(url: str) -> dict[str, object]:
    page = io.BytesIO()
    try:
        downloads.fetch(url, page, size=MAX_INDEX_PAGE)
        data = json.loads(page.getvalue())
    except downloads.TooBig:
        raise ExtforgeError(f"{url} is larger than {MAX_INDEX_PAGE >> 20} MiB", "an index's JSON page for a release is a "
                            "few kB to a few MB", "pass the API's root with --index, or --sdist FILE") from None
    except ExtforgeError as exc:
        raise ExtforgeError(f"could not read {url}", f"{exc.what}: {exc.why}",
                            f"{exc.fix}; check the name and version, or work offline: --sdist FILE (and --url URL)") from None
    except (ValueError, RecursionError) as exc:  # not JSON, or nested past the parser's depth
        raise ExtforgeError(f"could not read {url}", f"it is not JSON ({type(exc).__name__})",
                            "check --index names PyPI's JSON API (or a proxy's), or work offline: --sdist FILE") from None
    if not isinstance(data, dict):
        raise ExtforgeError(f"{url} is not the index's JSON API", "its answer is not a JSON object",
                            "pass the API's root with --index, or --sdist FILE")
    return data


def download(sdist: Sdist, into: Path) -> Path:
    """The sdist at `into/<filename>` (no link followed below `into`), at most the size the index
    lists and checked against its sha256."""
    target = into / sdist.filename
    try:
        downloads.download(sdist.url, target, size=sdist.size, sha256=sdist.sha256, beneath=into,
                           elsewhere="pass --sdist FILE")
    except downloads.TooBig:
        raise ExtforgeError(f"{sdist.url} gave more than the {sdist.size} bytes the index lists for {sdist.filename}",
                            "the download stopped there; nothing was kept",
                            "retry; a proxy between here and the index may have altered it") from None
    except downloads.Mismatch as exc:
        raise ExtforgeError(f"{sdist.filename} does not match the sha256 PyPI lists", f"got {exc.got}",
                            "retry; a proxy between here and the index may have altered it") from None
    return target


# What a damaged archive raises: a truncated stream (EOFError), a corrupt one (zlib's, lzma's
# errors), a zip member of a method or encryption zipfile does not read.
_UNREADABLE = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile, NotImplementedError,
               RuntimeError)


def _too_big(path: Path, why: str) -> ExtforgeError:
    return ExtforgeError(f"cannot read the sdist {path}", why, "pass the project's own source distribution")


def _member(path: Path, name: str, size: int, read: Callable[[int], bytes]) -> bytes:
    """A member's bytes, refused past MAX_MEMBER whatever its header says (read stops there)."""
    data = read(MAX_MEMBER + 1) if size <= MAX_MEMBER else b""
    if len(data) > MAX_MEMBER or size > MAX_MEMBER:
        raise _too_big(path, f"its {name} is larger than the {MAX_MEMBER >> 20} MiB recipe new reads of a metadata file")
    return data


def _count(path: Path, count: int) -> None:
    if count > MAX_MEMBERS:
        raise _too_big(path, f"it holds more than {MAX_MEMBERS:,} files")


# What recipe new reads of an sdist, by path below its top folder: the metadata files and each
# top-level package's __init__.py (how it loads its compiled modules) in full; C/C++ sources
# (the torch.ops registrations) and test files (what they import) until SOURCES_BUDGET bytes are read.
_READ = re.compile(r"^(PKG-INFO|setup\.py|pyproject\.toml|MANIFEST\.in|LICENSE(?:\.txt|\.md)?|[^/]+/__init__\.py|[^/]+\.egg-info/(requires|top_level)\.txt)$")
_SOURCE = re.compile(r"\.(cpp|cc|cxx)$")
_TEST_FILE = re.compile(r"^tests?/(?:[^/]+/)*(?:test_[^/]*|[^/]*_test)\.py$")
SOURCES_BUDGET = 16 * 2**20
MAX_READ = 64 * 2**20  # of the _READ files together


def archive_files(path: Path) -> dict[str, bytes]:
    """The sdist's files recipe new reads (_READ, each at most MAX_MEMBER; C/C++ sources and test
    files while SOURCES_BUDGET lasts) and, with no bytes, the names of its other test files and
    compiled sources (counted where setup.py globs them); nothing is extracted to disk."""
    out: dict[str, bytes] = {}
    budget, total = SOURCES_BUDGET, 0

    def wanted(name: str, size: int) -> str | None:
        """The member's path below the top folder where its bytes are read, else None (a test
        file's name is noted here)."""
        rel = name.split("/", 1)[1] if "/" in name else ""
        if _READ.match(rel) or ((_SOURCE.search(rel) or _TEST_FILE.match(rel)) and size <= budget):
            return rel
        if _TEST_FILE.match(rel) or _compiled(rel):
            out[rel] = b""
        return None

    def take(rel: str, name: str, size: int, read: Callable[[int], bytes]) -> None:
        nonlocal budget, total
        if _READ.match(rel):
            out[rel] = _member(path, name, size, read)
            total += len(out[rel])
            if total > MAX_READ:
                raise _too_big(path, f"its metadata and package __init__.py files hold more than {MAX_READ >> 20} MiB")
        else:
            out[rel] = read(budget)
            budget -= len(out[rel])

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                _count(path, len(z.infolist()))
                for info in z.infolist():
                    if not info.is_dir() and (rel := wanted(info.filename, info.file_size)) is not None:
                        with z.open(info) as stream:
                            take(rel, info.filename, info.file_size, stream.read)
        else:
            with tarfile.open(path) as tar:
                for count, member in enumerate(tar, 1):
                    _count(path, count)
                    if member.isfile() and (rel := wanted(member.name, member.size)) is not None \
                            and (f := tar.extractfile(member)):
                        take(rel, member.name, member.size, f.read)
    except _UNREADABLE as exc:
        raise ExtforgeError(f"cannot read the sdist {path}", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                            "pass a whole .tar.gz or .zip source distribution (a download cut short is truncated)") from None
    return out


def _compiled(name: str) -> bool:
    return PurePosixPath(name).suffix in COMPILED


def _path(node: ast.AST, names: Mapping[str, str]) -> str | None:
    """A folder or file pattern setup.py builds from literals: "csrc", a name bound to one,
    `os.path.join(...)` of such, `os.path.dirname(__file__)` (setup.py's own folder, "."); None
    where it computes more."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Call) and not node.keywords:
        if _call_name(node) == "dirname" and any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node)):
            return "."
        parts = [_path(a, names) for a in node.args]
        if _call_name(node) == "join" and parts and all(p is not None for p in parts):
            return posixpath.join(*(p for p in parts if p is not None))
    return None


def _globbed(tree: ast.AST) -> list[str]:
    """The folders of the patterns setup.py hands `glob.glob`/`glob.iglob`, as paths below the
    sdist's top folder (names bound anywhere in the file to one path, so a function's own
    `extensions_dir = osp.join("csrc")` counts)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _path(node.value, names)
            # A name bound to two paths names neither.
            if value is not None and names.setdefault(node.targets[0].id, value) != value:
                names[node.targets[0].id] = "\0"
    folders = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if _call_name(call) in ("glob", "iglob") and call.args and (pattern := _path(call.args[0], names)) \
                and "\0" not in pattern:
            fixed = itertools.takewhile(lambda part: not any(c in part for c in "*?["), pattern.split("/"))
            folders.append(posixpath.normpath("/".join(fixed) or "."))
    return sorted(set(folders))


def _literal(node: ast.AST | None, names: Mapping[str, object]) -> object:
    """A literal's value, or a module-level name bound to one; None when setup.py computes it."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return names.get(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):  # what literal_eval raises for code
        return None


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _strings(value: object) -> list[str] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return None


def read_setup_py(text: str) -> SetupFacts:
    try:
        return _read_setup_py(text)
    except (RecursionError, MemoryError):  # nested past what ast builds or walks (a hostile sdist)
        return SetupFacts(undecided=["setup.py is nested too deeply to read: extension modules, install_requires "
                                     "and packages not read"])


def _read_setup_py(text: str) -> SetupFacts:
    facts = SetupFacts()
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        facts.undecided.append(f"setup.py does not parse ({exc.msg}, line {exc.lineno}): extension modules, "
                               "install_requires and packages not read")
        return facts
    names: dict[str, object] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = _literal(stmt.value, names)
            if value is not None:
                names[stmt.targets[0].id] = value
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        kind, kwargs = _call_name(call), {k.arg: k.value for k in call.keywords if k.arg}
        if kind in EXTENSION_CALLS:
            name = _literal(kwargs.get("name", call.args[0] if call.args else None), names)
            sources = _strings(_literal(kwargs.get("sources", call.args[1] if len(call.args) > 1 else None), names))
            if isinstance(name, str):
                facts.extensions.append(Extension(name, kind, None if sources is None else tuple(sources)))
            else:
                facts.unnamed += 1
                facts.computed_names.append(f"setup.py line {call.lineno}: a {kind} whose name it computes: add its "
                                            "module to tests.python.imports")
        elif kind == "setup":
            facts.metadata = {k: v for k in SETUP_METADATA if isinstance(v := _literal(kwargs.get(k), names), str)}
            if "install_requires" in kwargs:
                facts.install_requires = _strings(_literal(kwargs["install_requires"], names))
                if facts.install_requires is None:
                    facts.undecided.append("setup.py computes install_requires: check requirements.run")
            if isinstance(ext := kwargs.get("ext_modules"), ast.IfExp):
                facts.only_if = OnlyIf(ext.lineno, ast.unparse(ext.test),
                                       frozenset(n.id for n in ast.walk(ext.test) if isinstance(n, ast.Name)))
            packages = kwargs.get("packages")
            if isinstance(packages, ast.Call) and _call_name(packages).startswith("find"):
                exclude = next((k.value for k in packages.keywords if k.arg == "exclude"), None)
                facts.find_exclude = _strings(_literal(exclude, names)) or []
            elif packages is not None:
                facts.packages = _strings(_literal(packages, names))
    facts.globbed = _globbed(tree)
    facts.archs = sorted(set(re.findall(r"(?:code|arch)=(?:sm|compute)_(\d+a?)", text)), key=lambda a: int(a.rstrip("a")))
    facts.switches = sorted(set(re.findall(r"[\"']([A-Z][A-Z0-9_]*_(?:FORCE_BUILD|SKIP_CUDA_BUILD))[\"']", text)))
    facts.reads = sorted(set(ENV_READ.findall(text)))
    return facts


def tree_metadata(path: Path, files: Mapping[str, bytes]) -> email.message.Message:
    """PKG-INFO's fields from an archive of upstream's tree (GitHub's archive of a tag: no
    PKG-INFO), where setup.py names them as literals; the version may come from the package's
    `__version__` line, as setup.py reads it."""
    setup = read_setup_py(files["setup.py"].decode(errors="replace")) if "setup.py" in files else SetupFacts()
    versions = {m[1] for p, t in files.items() if p.endswith("/__init__.py") and (m := VERSION_LINE.search(t.decode(errors="replace")))}
    name = setup.metadata.get("name")
    version = setup.metadata.get("version") or (versions.pop() if len(versions) == 1 else None)
    if name is None or version is None:
        raise ExtforgeError(f"{path.name} has no PKG-INFO, and its setup.py computes its {'name' if name is None else 'version'}",
                            "a source distribution carries its metadata in PKG-INFO; an archive of upstream's tree is read "
                            "where setup.py names the release as literals",
                            "pass the project's sdist, or an archive of the release's tag whose setup.py names it")
    meta = email.message.Message()
    for key, field_name in (("name", "Name"), ("description", "Summary"), ("url", "Home-page"), ("license", "License")):
        if key in setup.metadata:
            meta[field_name] = setup.metadata[key]
    meta["Version"] = version
    return meta


def license_heading(files: Mapping[str, bytes]) -> str | None:
    """The SPDX license a top-level LICENSE file's first line names (LICENSE_HEADINGS), or None."""
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md"):
        lines = files.get(name, b"").decode(errors="replace").strip().splitlines()
        if lines and (spdx := LICENSE_HEADINGS.get(lines[0].strip().lstrip("# "))):
            return spdx
    return None


def read_sdist(path: Path) -> SdistFacts:
    files = archive_files(path)
    meta = email.parser.Parser().parsestr(files["PKG-INFO"].decode(errors="replace")) if "PKG-INFO" in files \
        else tree_metadata(path, files)
    try:
        project = tomllib.loads(files["pyproject.toml"].decode(errors="replace")) if "pyproject.toml" in files else {}
        unread = []
    except tomllib.TOMLDecodeError as exc:
        project, unread = {}, [f"pyproject.toml does not parse ({exc}): its build requirements not read"]
    except RecursionError:
        project, unread = {}, ["pyproject.toml is nested too deeply to read: its build requirements not read"]
    urls = dict(u.split(",", 1) for u in meta.get_all("Project-URL") or [] if "," in u)
    homepage = meta.get("Home-page") or next((v.strip() for k, v in urls.items()
                                              if k.strip().lower() in ("homepage", "home", "source", "repository")), None)
    license_text = meta.get("License-Expression") or meta.get("License")
    if not license_text or license_text.strip().upper() == "UNKNOWN":
        # setuptools wrote "UNKNOWN" where setup.py named none; a trove classifier may name it.
        named = {LICENSE_CLASSIFIERS.get(c.rsplit("::", 1)[-1].strip()) for c in meta.get_all("Classifier") or []
                 if c.startswith("License ::")} - {None}
        license_text = named.pop() if len(named) == 1 else license_heading(files)
    facts = SdistFacts(
        name=str(meta["Name"]), version=str(meta["Version"]), summary=meta.get("Summary"), homepage=homepage,
        license=license_text if license_text and "\n" not in license_text.strip() and len(license_text) < 80 else None,
        build_requires=_pyproject_list(project, "build-system", "requires"),
        package_dirs=sorted(p.split("/")[0] for p in files if p.endswith("/__init__.py")),
        top_level=next((t.decode(errors="replace").split() for p, t in files.items() if p.endswith(".egg-info/top_level.txt")),
                       None),
        setup=read_setup_py(files["setup.py"].decode(errors="replace")) if "setup.py" in files else None,
        undecided=unread,
        compiled=sorted(p for p in files if _compiled(p)),
        download_url=meta.get("Download-URL"),
        texts={p: t.decode(errors="replace") for p, t in files.items() if t},
        test_files=sorted(p for p, t in files.items() if _TEST_FILE.match(p)),
    )
    egg_requires = next((t.decode(errors="replace") for p, t in files.items() if p.endswith(".egg-info/requires.txt")), "")
    for where, found in (("PKG-INFO", meta.get_all("Requires-Dist")),
                         ("egg-info/requires.txt", requires_txt(egg_requires)),
                         ("setup.py", facts.setup.install_requires if facts.setup else None),
                         ("pyproject.toml", _pyproject_list(project, "project", "dependencies"))):
        if found:
            facts.requires, facts.requires_from = [str(r) for r in found], where
            break
    return facts


def _pyproject_list(project: Mapping[str, object], table: str, key: str) -> list[str]:
    """project[table][key] where it is a list of strings, else nothing."""
    section = project.get(table)
    return (_strings(section.get(key)) or []) if isinstance(section, dict) else []


def requires_txt(text: str) -> list[str]:
    """setuptools' requires.txt as requirements: a `[extra:marker]` section's lines carry its
    extra and marker the way Requires-Dist writes them."""
    out, marker = [], ""
    for line in (raw.strip() for raw in text.splitlines()):
        if m := re.fullmatch(r"\[([^:\]]*):?([^\]]*)\]", line):
            parts = [f'extra == "{m[1]}"' if m[1] else "", f"({m[2]})" if m[2] else ""]
            marker = " and ".join(p for p in parts if p)
        elif line and not line.startswith("#"):
            out.append(f"{line}; {marker}" if marker else line)
    return out


def conda_spec(requirement: str) -> tuple[str | None, str | None]:
    """A PyPI requirement as a conda match spec, or (None, why not): an optional extra, a
    requirement for some platforms only, a direct URL."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None, f"'{requirement}' is not a requirement packaging can read"
    if req.marker is not None:
        marker = str(req.marker)
        if "extra" in marker:
            return None, f"'{requirement}' is for an optional extra"
        if any(word in marker for word in PYTHON_MARKERS):
            return None, f"'{requirement}' depends on the python a variant builds for: add it by hand if the targets need it"
        if not req.marker.evaluate(LINUX_X86_64):
            return None, f"'{requirement}' is not for linux-64"
    if req.url:
        return None, f"'{requirement}' names a URL, not an index package"
    name = canonicalize_name(req.name)
    spec = ",".join(sorted(str(s) for s in req.specifier))
    if "===" in spec:
        return None, f"'{requirement}' uses ===, which conda specs lack"
    return f"{CONDA_NAMES.get(name, name)} {spec}".strip(), None


def op_libraries(facts: SdistFacts) -> OpsTest | None:
    """The torch.ops test of a package whose compiled modules are op libraries: its __init__.py
    loads them with torch.ops.load_library (pyg's PyInit returns NULL: they cannot be imported),
    and its C++ sources register the ops (`RegisterOperators().op("ns::op")`, `TORCH_LIBRARY`)."""
    loader = next((p.split("/")[0] for p, t in sorted(facts.texts.items())
                   if p.endswith("/__init__.py") and "torch.ops.load_library" in t), None)
    if loader is None or not MODULE_NAME.fullmatch(loader):
        return None
    ops: dict[str, set[str]] = {}
    for path, text in facts.texts.items():
        if not _SOURCE.search(path):
            continue
        for namespace, op in OP_REGISTRATION.findall(text):
            ops.setdefault(namespace, set()).add(op)
        for namespace, var in TORCH_LIBRARY.findall(text):
            defined = re.findall(rf"\b{var}\.def\(\s*(?:TORCH_SELECTIVE_SCHEMA\(\s*)?\"(?:{namespace}::)?({IDENTIFIER})", text)
            ops.setdefault(namespace, set()).update(defined)
    if not any(ops.values()):
        return None
    # The namespace named like the package, else the one with the most ops.
    namespace = loader if ops.get(loader) else max(sorted(ops), key=lambda n: len(ops[n]))
    return OpsTest(loader, namespace, tuple(sorted(ops[namespace])))


@dataclass(frozen=True)
class OpsTest:
    """A script test: importing the package registers every op, and a CUDA build says its CUDA."""

    package: str
    namespace: str
    ops: tuple[str, ...]

    def command(self) -> str:
        check = (f"v = ops.cuda_version(); print('{self.namespace} CUDA', v); assert v > 0, v"
                 if "cuda_version" in self.ops else f"print('{self.namespace}: {len(self.ops)} ops')")
        return (f"python -c \"import torch, {self.package}; ops = torch.ops.{self.namespace}; "
                f"[getattr(ops, n) for n in {self.ops!r}]; {check}\"")


def import_names(facts: SdistFacts, ops: OpsTest | None = None) -> tuple[list[str], list[str]]:
    """The modules the package test imports: top-level packages, then extension modules (none
    where they are op libraries, tested through `ops`); and what could not be decided about them."""
    setup, undecided = facts.setup, []
    if facts.top_level is not None:
        tops = facts.top_level
    elif setup and setup.packages is not None:
        tops = list(dict.fromkeys(p.split(".")[0] for p in setup.packages))
    else:
        excluded = setup.find_exclude if setup and setup.find_exclude is not None else []
        tops = [d for d in facts.package_dirs if not any(fnmatch(d, x) for x in excluded)]
    exts = [e.name for e in setup.extensions] if setup and ops is None else []
    # An upstream whose tests folder installs as a package: importing it proves nothing about the product.
    tops = [t for t in tops if t not in NOT_PACKAGES and t not in exts and "." not in t]
    for name in [n for n in [*tops, *exts] if not MODULE_NAME.fullmatch(n)]:
        undecided.append(f"left out of tests.python.imports: {name!r} is not a Python module name")
    tops, exts = [t for t in tops if MODULE_NAME.fullmatch(t)], [e for e in exts if MODULE_NAME.fullmatch(e)]
    if not tops:
        undecided.append("no top-level Python package found: tests.python.imports lists the extension modules only")
    if setup and ops is None:
        undecided += setup.computed_names
        if not exts:
            undecided.append("setup.py declares no CUDAExtension/CppExtension that could be read: "
                             "add the compiled modules to tests.python.imports, or, where they are torch op libraries "
                             "that the package loads with torch.ops.load_library (not importable), a script test "
                             "that calls one of their ops through torch.ops")
    return list(dict.fromkeys([*tops, *exts])), undecided


@dataclass(frozen=True)
class Evidence:
    file: str  # a glob of a path below the sdist's top folder
    pattern: str  # a regular expression found in that file's text


@dataclass(frozen=True)
class KnownSwitch:
    """A row of data/build-switches.yaml (or download-switches.yaml's, as a build-or-download row)."""

    decides: str
    values: Mapping[str, str]
    reason: str
    reads: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def applies(self, reads: set[str], texts: Mapping[str, str]) -> bool:
        return set(self.reads) <= reads and all(
            any(fnmatch(path, e.file) and re.search(e.pattern, text) for path, text in texts.items()) for e in self.evidence)


@dataclass(frozen=True)
class Decision:
    """A switch recipe new sets in build.script.env, and why (the comment above it)."""

    decides: str
    values: Mapping[str, str]
    reason: str


ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
ENV_VALUE = re.compile(r"[A-Za-z0-9._-]*")


@cache
def known_switches() -> tuple[KnownSwitch, ...]:
    text = resources.files("extforge").joinpath("data/build-switches.yaml").read_text(encoding="utf-8")
    rows = [KnownSwitch(str(r["decides"]), {str(k): str(v) for k, v in r["set"].items()}, str(r["reason"]),
                        tuple(str(v) for v in r.get("reads", ())),
                        tuple(Evidence(str(e["file"]), str(e["pattern"])) for e in r.get("evidence", ())))
            for r in YAML(typ="safe").load(text)["switches"]]
    rows += [KnownSwitch("build or download", sw.values, "compile here, never download upstream's prebuilt wheel "
                         "(the build layer refuses the download either way)", reads=(next(iter(sw.values)),))
             for sw in build_layer.switches()]
    for row in rows:
        if not (row.reads or row.evidence) or not all(ENV_NAME.fullmatch(k) and ENV_VALUE.fullmatch(v)
                                                      for k, v in row.values.items()):
            raise ValueError(f"build-switches.yaml: the row deciding {row.decides} {dict(row.values)} needs reads or "
                             "evidence, and plain variable names and values")
    return tuple(rows)


def decide_switches(facts: SdistFacts) -> list[Decision]:
    """The switches the sdist shows it needs, one per thing decided (the first row that applies)."""
    reads = set(facts.setup.reads) if facts.setup else set()
    chosen: dict[str, Decision] = {}
    for row in known_switches():
        if row.decides not in chosen and row.applies(reads, facts.texts):
            chosen[row.decides] = Decision(row.decides, row.values, row.reason)
    return list(chosen.values())


@dataclass(frozen=True)
class UpstreamTests:
    """upstream's test files: in the sdist, or where upstream keeps them."""

    in_sdist: tuple[str, ...]
    folder: str | None = None  # where upstream keeps them (MANIFEST.in's excluded folder)
    url: str | None = None  # that folder at the release's tag
    why: str = ""  # why the sdist lacks them
    requires: tuple[str, ...] = ()  # the test extra's requirements (PyPI names)
    imported: tuple[str, ...] = ()  # what the test files import beyond the package, torch and the stdlib (PyPI names)

    def describe(self) -> str:
        if self.in_sdist:
            folders = sorted({p.split("/")[0] for p in self.in_sdist})
            return f"upstream's tests are in the sdist: {', '.join(f'{f}/' for f in folders)} ({len(self.in_sdist)} files)"
        where = self.url or (f"{self.folder}/ of upstream's repository at the release's tag" if self.folder else
                             "upstream's repository, at the release's tag")
        return f"upstream's tests are not in the sdist{f' ({self.why})' if self.why else ''}: {where}"


GITHUB = re.compile(r"https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?")
ARCHIVE_TAG = re.compile(r"https://github\.com/[^/]+/[^/]+/archive/(?:refs/tags/)?([A-Za-z0-9_.+-]+?)\.(?:tar\.gz|zip)")
TEST_EXTRAS = ("test", "tests", "testing")


def for_tests(requirement: str) -> str | None:
    """The PyPI name of a requirement of the package's test extra (`pytest; extra == "test"`)."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    marker = req.marker
    in_extra = marker is not None and not marker.evaluate(LINUX_X86_64) and any(
        marker.evaluate({**LINUX_X86_64, "extra": x}) for x in TEST_EXTRAS)
    return req.name if in_extra else None


def test_imports(facts: SdistFacts, declared: Sequence[str]) -> tuple[str, ...]:
    """The PyPI names of the modules upstream's test files import (`import einops`, `from scipy
    import ...`) that are not the package's own, torch, the standard library, a module beside
    the tests or already `declared`: fast-hadamard-transform's tests import einops and pytest
    and declare neither."""
    own = {*facts.package_dirs, *(facts.top_level or ()), *(e.name for e in (facts.setup.extensions if facts.setup else ())),
           *(PurePosixPath(p).stem for p in facts.test_files), "torch", "tests", "test", "conftest"}
    found: dict[str, None] = {}
    # Read by lines, not parsed: ast of the budget's 16 MiB of statements would take gigabytes.
    for m in (m for path in facts.test_files for m in IMPORT_LINE.finditer(facts.texts.get(path, ""))):
        names = [m[1]] if m[1] else [part.split(" as ")[0].strip() for part in m[2].strip("()\\ \t").split(",")]
        for top in (n.split(".")[0] for n in names):
            if top not in own and top not in sys.stdlib_module_names and MODULE_NAME.fullmatch(top):
                found[IMPORT_NAMES.get(top, top)] = None
    taken = {canonicalize_name(d) for d in declared}
    return tuple(n for n in found if canonicalize_name(n) not in taken)


def upstream_tests(facts: SdistFacts) -> UpstreamTests:
    requires = tuple(dict.fromkeys(n for r in facts.requires if (n := for_tests(r))))
    if facts.test_files:
        return UpstreamTests(tuple(facts.test_files), requires=requires, imported=test_imports(facts, requires))
    manifest = re.search(r"(?m)^\s*((?:recursive-exclude|prune)\s+(tests?)\b.*?)\s*$", facts.texts.get("MANIFEST.in", ""))
    folder = manifest[2] if manifest else None
    repo = next((m for m in (GITHUB.fullmatch(u or "") for u in (facts.homepage, facts.download_url)) if m), None)
    if repo is None and facts.download_url:
        repo = GITHUB.match(facts.download_url)
    tag = ARCHIVE_TAG.fullmatch(facts.download_url or "")
    url = (f"https://github.com/{repo[1]}/{repo[2]}/tree/{tag[1]}/{folder}"
           if repo and tag and folder and URL.fullmatch(f"https://github.com/{repo[1]}/{repo[2]}/tree/{tag[1]}/{folder}")
           else None)
    return UpstreamTests((), folder, url, f"MANIFEST.in: {manifest[1]}" if manifest else "", requires)


@dataclass(frozen=True)
class Lacking:
    """A requirement the channel has no package for, and the `extforge mirror --extra` that adds it."""

    conda: str
    pypi: str
    needed_by: str  # "run" or "upstream's tests"


@dataclass
class Scaffold:
    """A recipe for one sdist, and what the recipe could not decide."""

    name: str
    version: str
    sdist: Sdist
    host_extra: list[str]
    run: list[str]
    imports: list[str]
    summary: str | None
    homepage: str | None
    license: str | None
    archs: tuple[str, ...]
    units: int | None  # translation units, where setup.py lists every source
    undecided: list[str]
    decisions: list[Decision] = field(default_factory=list)
    ops: OpsTest | None = None
    tests: UpstreamTests = field(default_factory=lambda: UpstreamTests(()))
    run_pypi: dict[str, str] = field(default_factory=dict)  # conda name -> the PyPI name it came from

    def lacking(self, available: set[str]) -> list[Lacking]:
        """The run and test requirements a channel holding `available` package names lacks."""
        out = [Lacking(spec.split()[0], self.run_pypi.get(spec.split()[0], spec.split()[0]), "run")
               for spec in self.run if spec.split()[0] not in available]
        for pypi in (*self.tests.requires, *self.tests.imported):
            conda = CONDA_NAMES.get(canonicalize_name(pypi), canonicalize_name(pypi))
            if conda not in available and conda not in {x.conda for x in out}:
                out.append(Lacking(conda, pypi, "upstream's tests"))
        return out

    def recipe_yaml(self) -> str:
        q = json.dumps  # a JSON string is a YAML double-quoted scalar: summaries hold colons and quotes
        about = [f"  {key}: {q(value)}" for key, value in
                 (("homepage", self.homepage), ("summary", self.summary), ("license", self.license)) if value]
        switches = [line for d in self.decisions for line in
                    (f"      # {d.decides}: {d.reason}", *(f"      {k}: {q(v)}" for k, v in d.values.items()))]
        ops_test = ["  # Its compiled modules are torch op libraries (the package loads them with torch.ops.load_library):",
                    f"  # each op of torch.ops.{self.ops.namespace} must be registered.",
                    "  - script:", f"      - {q(self.ops.command())}", "    requirements:", "      run:", "        - python"] \
            if self.ops else []
        tests_note = [f"# {self.tests.describe()}"] + ([f"# They need {', '.join(self.tests.requires)} (upstream's test extra)."]
                                                        if self.tests.requires else []) \
            + ([f"# They import {', '.join(self.tests.imported)}."] if self.tests.imported else [])
        lines = [
            "schema_version: 1",
            "",
            f"# Written by `extforge recipe new {self.name}=={self.version}` from the sdist's own metadata.",
            "context:",
            f"  name: {self.name}",
            f"  version: {q(self.version)}",
            "",
            "package:",
            "  name: ${{ name }}",
            "  version: ${{ version }}",
            "",
            "source:",
            "  url:",
            "    - file://${{ env.get(\"EXTFORGE_SOURCES\", default=\"/nonexistent\") }}/sha256/"
            # `sources fetch` stores the archive under the URL's file name (GitHub's tag archive: v1.1.0.tar.gz).
            f"{self.sdist.sha256}/{downloads.url_file_name(self.sdist.url)}",
            f"    - {q(self.sdist.url)}",
            f"  sha256: {self.sdist.sha256}",
            "",
            "build:",
            "  number: 0",
            "  script:",
            "    env:",
            "      TORCH_CUDA_ARCH_LIST: ${{ cuda_archs }}",
            *switches,
            "    content:",
            "      - ${{ PYTHON }} -m pip install . --no-deps --no-build-isolation -v",
            "",
            "requirements:",
            "  build:",
            "    - ${{ compiler('c') }}",
            "    - ${{ compiler('cxx') }}",
            "    - ${{ compiler('cuda') }}",
            "    - extforge-torch-build",
            "    - ninja",
            "  host:",
            *(f"    - {r}" for r in HOST_BASE),
            "    - cuda-version ${{ cuda_compiler_version }}.*",
            *(f"    - {r}" for r in self.host_extra),
            "  run:",
            "    - python",
            "    - ${{ pin_compatible('cuda-version', lower_bound='x.x', upper_bound='x') }}",
            *(f"    - {r}" for r in self.run),
            "",
            *tests_note,
            "tests:",
            "  - python:",
            f"      imports: [{', '.join(self.imports)}]",
            "      pip_check: false",
            *ops_test,
            *(["", "about:", *about] if about else []),
        ]
        return "\n".join(lines) + "\n"

    def variants_yaml(self) -> str | None:
        """The recipe's own variants.yaml: the GPU archs asked for; None where none were (the
        build layer's variants.yaml gives them, as it gives the build string)."""
        if not self.archs:
            return None
        return ("# The GPU archs to compile for (TORCH_CUDA_ARCH_LIST); the channel's variants.yaml gives python,\n"
                "# pytorch, the CUDA toolkit and the compilers.\n"
                f"cuda_archs:\n  - {json.dumps(';'.join(self.archs))}\n")


def _requirement_name(text: str) -> str | None:
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return None


def _specs(requirements: Iterable[str], skip: set[str], what: str, undecided: list[str],
           pypi: dict[str, str] | None = None) -> list[str]:
    """Conda specs of `requirements` (less `skip`); `pypi` gets each spec's PyPI name by conda name."""
    out = []
    for r in requirements:
        spec, why = conda_spec(r)
        if spec is None:
            undecided.append(f"{what}: skipped {why}")
        elif not CONDA_SPEC.fullmatch(spec):
            undecided.append(f"{what}: skipped {r!r}: its conda spec {spec!r} has characters a recipe line must not")
        elif spec.split()[0] not in skip:
            out.append(spec)
            if pypi is not None:
                pypi[spec.split()[0]] = Requirement(r).name
    return list(dict.fromkeys(out))


def scaffold(facts: SdistFacts, sdist: Sdist, archs: Sequence[str]) -> Scaffold:
    setup = facts.setup
    undecided = [*facts.undecided, *(setup.undecided if setup else ["the sdist has no setup.py: extension modules not read"])]
    # torch comes from the channel's variants (host) and is pinned exactly at run time (its run_exports).
    torch = sorted({r for r in [*facts.requires, *facts.build_requires] if _requirement_name(r) == "torch"
                    and Requirement(r).specifier})
    if torch:
        undecided.append(f"upstream asks for {', '.join(torch)}: the channel's pytorch variants decide the torch "
                         "built against; build only for those that meet it")
    host_extra = _specs(facts.build_requires, {*HOST_BASE, *BUILD_ONLY}, "build requirement", undecided)
    run_pypi: dict[str, str] = {}
    # The test extra's requirements are upstream's tests' (UpstreamTests.requires), not the package's.
    run = _specs([r for r in facts.requires if not for_tests(r)], {"python", "pytorch", *BUILD_ONLY},
                 f"runtime requirement ({facts.requires_from})", undecided, run_pypi)
    ops = op_libraries(facts)
    imports, why = import_names(facts, ops)
    undecided += why
    decisions = decide_switches(facts)
    decided = {k for d in decisions for k in d.values}
    # Upstream's own -gencode list is no decision left open: extforge-torch-build replaces it with
    # the variant's archs at every compile, and the audit fails code for any other arch.
    unknown = [v for v in (setup.switches if setup else ()) if v not in decided and "FORCE" in v]
    if unknown:
        undecided.append(f"setup.py reads {', '.join(unknown)}, a switch extforge does not know: if it selects a "
                         "source build over a prebuilt-wheel download, set it in build.script.env (the build layer "
                         "refuses the download either way, so the build fails until it is set)")
    if setup and setup.only_if and not setup.only_if.names & decided:
        undecided.append(f"setup.py line {setup.only_if.line} compiles its extensions only if `{setup.only_if.condition}`"
                         + (f" (it reads {', '.join(setup.reads)} from the environment)" if setup.reads else "")
                         + ": set what keeps them in build.script.env, else the package has no compiled module "
                         "(the import test fails)")
    if missing := missing_sources(setup, facts.compiled):
        undecided.append(f"the sdist lacks {len(missing)} of the sources setup.py compiles ({', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''}): unless setup.py generates them, a build from it fails; write the recipe from "
                         f"upstream's archive of the release's tag: extforge recipe new {canonicalize_name(facts.name)}=={facts.version} --force "
                         f"--sdist ARCHIVE --url {tag_archive(facts)}")
    if not facts.license:
        undecided.append("no short license in PKG-INFO or the first line of LICENSE: about.license left out")
    about = {key: _about(key, value, undecided) for key, value in
             (("summary", facts.summary), ("homepage", facts.homepage), ("license", facts.license))}
    # conda names are PyPI's normalized (causal_conv1d's PKG-INFO names it so; its package is causal-conv1d).
    return Scaffold(canonicalize_name(facts.name), facts.version, sdist, host_extra, run, imports, about["summary"],
                    about["homepage"], about["license"], tuple(archs), translation_units(setup, facts.compiled), undecided,
                    decisions, ops, upstream_tests(facts), run_pypi)


def missing_sources(setup: SetupFacts | None, compiled: Sequence[str]) -> list[str]:
    """The sources setup.py lists by name (relative paths) that the archive lacks: fast-hadamard-
    transform 1.1.0's sdist holds setup.py but not the csrc/ it compiles (no MANIFEST.in)."""
    listed = (posixpath.normpath(s) for e in (setup.extensions if setup else ()) for s in e.sources or ()
              if _compiled(s) and not posixpath.isabs(s))
    return sorted({s for s in listed if not s.startswith("..")} - set(compiled))


def tag_archive(facts: SdistFacts) -> str:
    """GitHub's archive of the release's tag, where the home page is a GitHub repository (the tag
    spelled vVERSION, upstream's usual); else where to look."""
    repo = GITHUB.fullmatch(facts.homepage or "")
    return (f"https://github.com/{repo[1]}/{repo[2]}/archive/refs/tags/v{facts.version}.tar.gz" if repo
            else "URL (upstream's archive of the release's tag)")


def _about(key: str, value: str | None, undecided: list[str]) -> str | None:
    """A PKG-INFO text for about.KEY; left out, with a line, where rattler-build would read it as
    Jinja (it renders every string of a recipe) or a homepage is no URL."""
    if value is None:
        return None
    if any(mark in value for mark in JINJA) or (key == "homepage" and not URL.fullmatch(value)):
        undecided.append(f"about.{key} left out: PKG-INFO's {value[:80]!r} is not plain text{' or a URL' * (key == 'homepage')}")
        return None
    return value


def translation_units(setup: SetupFacts | None, compiled: Sequence[str] = ()) -> int | None:
    """The compiles a build runs (the planner's unit count), where setup.py lists every
    extension's sources, or globs them: then the sdist's `compiled` sources below the folders it
    globs (torch-scatter's and torch-cluster's `glob.glob(osp.join(extensions_dir, '*.cpp'))`
    with the `cpu/` and `cuda/` files each main file pulls in), and any it lists beside them;
    None where it computes them otherwise."""
    if not setup:
        return None
    if setup.globbed:
        listed = {posixpath.normpath(s) for e in setup.extensions for s in e.sources or () if _compiled(s)}
        found = listed | {f for f in compiled if any(d == "." or f.startswith(f"{d}/") for d in setup.globbed)}
        return len(found) or None
    if not setup.extensions or setup.unnamed or any(e.sources is None for e in setup.extensions):
        return None
    return sum(_compiled(s) for e in setup.extensions for s in e.sources or ())


def sdist_units(sdist: Path) -> int | None:
    """translation_units of an sdist's setup.py; None where it cannot be read or counted."""
    try:
        facts = read_sdist(sdist)
    except ExtforgeError:
        return None
    return translation_units(facts.setup, facts.compiled)


def parse_requirement(text: str) -> tuple[str, str]:
    """'causal-conv1d==1.7.0' -> ('causal-conv1d', '1.7.0')."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*", text)
    if not m:
        raise ValueError("write it as NAME==VERSION, e.g. causal-conv1d==1.7.0")
    return m[1], m[2]

