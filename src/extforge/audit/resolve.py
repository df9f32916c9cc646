"""Where a module's libraries and symbols come from in a target environment.

Library search follows the dynamic loader at the user's site: a name the process has
already loaded (the interpreter's libraries, and the torch libraries `import torch` loaded
before the extension) is that object, matched by soname; else the requester's RPATH (only
when it has no RUNPATH), its RUNPATH, then the target prefix's lib dirs, the torch lib dir
inside site-packages, the nvidia wheels' lib dirs, then the system dirs. A search path of the
audited files or the target environment is searched only where it leads inside them (or to a
system dir): a folder of the auditing machine that an absolute RUNPATH names is never read,
since on a node it is not the folder the build had (search_paths reports such entries).
Symbol lookup walks the global scope (the interpreter and its libraries) and then the
module's DT_NEEDED closure breadth-first, honouring symbol versions.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ExtforgeError
from .elf import ElfObject, Symbol, open_elf
from .policy import is_interpreter_symbol, policy

_MULTIARCH = f"{platform.machine()}-linux-gnu"
SYSTEM_DIRS = tuple(
    Path(d)
    for d in (f"/lib/{_MULTIARCH}", f"/usr/lib/{_MULTIARCH}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
)


@dataclass
class TargetEnv:
    """The environment a module must load in: a prefix, a site-packages, or a bare lib dir."""

    root: Path | None
    kind: str | None = None  # a key of TARGET_KINDS; None: the system libraries alone
    lib_dirs: list[Path] = field(default_factory=list)
    interpreter: Path | None = None
    torch_lib: Path | None = None
    torch: str | None = None  # "2.14.1+cu130" or "2.14.1 cuda130_py311_h..._0"
    cuda_version: str | None = None
    python: str | None = None  # "3.12", from its lib/python3.X folder

    @property
    def torch_version(self) -> str | None:
        """The torch release alone: "2.14.1+cu130" (pip) or "2.14.1" (conda's version and build)."""
        return self.torch.split()[0] if self.torch else None

    def is_system(self, path: Path) -> bool:
        return any(path.is_relative_to(d) for d in SYSTEM_DIRS) and not (
            self.root is not None and path.is_relative_to(self.root)
        )


TARGET_KINDS = {
    "venv": "a virtual environment (pyvenv.cfg): pip's torch and the nvidia-* wheels it loads",
    "conda": "a conda prefix (conda-meta)",
    "torch-lib": "a torch/lib folder",
    "site-packages": "a site-packages folder or a prefix holding one",
    "libraries": "a folder of libraries",
}


def target_kind(root: Path) -> str | None:
    """Which kind of environment a folder is (a key of TARGET_KINDS); None: none of them."""
    if (root / "pyvenv.cfg").is_file():
        return "venv"
    if (root / "conda-meta").is_dir():
        return "conda"
    if (root / "libc10.so").is_file():
        return "torch-lib"
    if root.name.endswith("-packages") or (root / "torch").is_dir() or next(root.glob("lib/python3*/site-packages"), None):
        return "site-packages"
    if next(root.glob("*.so*"), None) is not None:
        return "libraries"
    return None


def target_env(root: Path | None) -> TargetEnv:
    """Find the lib dirs, interpreter and torch of `root` (None: the system alone)."""
    if root is None:
        return TargetEnv(None)
    root = root.resolve()
    kind = target_kind(root)
    if kind is None:
        raise ExtforgeError(
            f"{root} is neither a venv (no pyvenv.cfg) nor a conda prefix (no conda-meta)",
            "nor a site-packages folder, a torch/lib folder or a folder of libraries: there is no environment to "
            "resolve the modules' libraries and symbols in",
            "pass the environment the modules must run in: a venv made by `python -m venv`, a conda prefix, "
            "its site-packages folder or its torch/lib folder",
        )
    env = TargetEnv(root, kind)
    if kind == "torch-lib":
        env.lib_dirs.append(root)
        env.torch_lib = root
        _read_torch_version(env, root.parent)
        return env
    # A plain folder of libraries is its own lib dir.
    if next(root.glob("*.so*"), None) is not None:
        env.lib_dirs.append(root)
    env.lib_dirs.extend(d for d in (root / "lib", root / "lib64") if d.is_dir())
    site_dirs = [root, *sorted(root.glob("lib/python3*/site-packages"))]
    env.python = next((d.parent.name.removeprefix("python") for d in site_dirs[1:]), None)
    if kind == "venv":
        site_dirs += _system_site_dirs(root, env.python)
    for site in site_dirs:
        if env.torch_lib is None and (site / "torch" / "lib").is_dir():
            env.torch_lib = site / "torch" / "lib"
            env.lib_dirs.append(env.torch_lib)
            _read_torch_version(env, site / "torch")
        env.lib_dirs.extend(sorted(site.glob("nvidia/*/lib")))
    for name in ("python3", "python"):
        candidate = root / "bin" / name
        if candidate.exists():
            env.interpreter = candidate.resolve()
            break
    # A venv's python lives outside it, and so does the libpython a module links against: at
    # import time it is the one that python already loaded, from its own prefix.
    if env.interpreter and not env.interpreter.is_relative_to(root):
        base_lib = env.interpreter.parent.parent / "lib"
        if next(base_lib.glob("libpython3*.so*"), None) is not None:
            env.lib_dirs.append(base_lib)
    _read_conda_torch(env, root)
    return env


def _system_site_dirs(venv: Path, python: str | None) -> list[Path]:
    """The base interpreter's site-packages of a venv made with --system-site-packages, searched
    after its own as its python does: a venv on a conda env holding pip's torch finds torch there."""
    try:
        with (venv / "pyvenv.cfg").open(errors="replace") as fh:
            text = fh.read(1 << 16)
    except OSError:
        return []
    cfg = {k.strip().lower(): v.strip() for k, _, v in (line.partition("=") for line in text.splitlines())}
    if cfg.get("include-system-site-packages", "").lower() != "true" or not cfg.get("home") or python is None:
        return []
    site = Path(cfg["home"]).parent / "lib" / f"python{python}" / "site-packages"
    return [site] if site.is_dir() else []


def _read_torch_version(env: TargetEnv, torch_dir: Path) -> None:
    # torch/version.py is plain assignments; read, never import (the tool never imports torch).
    try:
        text = (torch_dir / "version.py").read_text()
    except OSError:
        return
    if m := re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M):
        env.torch = m.group(1)
    if m := re.search(r"^cuda(?::[^=]*)?\s*=\s*['\"]([^'\"]+)", text, re.M):
        env.cuda_version = m.group(1)


def _read_conda_torch(env: TargetEnv, root: Path) -> None:
    for record in sorted((root / "conda-meta").glob("pytorch-*.json")):
        try:
            meta = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("name") == "pytorch":
            env.torch = f"{meta['version']} {meta.get('build', '')}".strip()


@dataclass
class Resolution:
    closure: list[ElfObject]  # the module first, then its libraries breadth-first
    missing: list[tuple[str, str]]  # (library name, the object that needs it)
    unresolved: list[Symbol]
    assumed_interpreter: list[Symbol]  # Py* symbols left to the loading interpreter


class Resolver:
    """Loads each library once per audit; a package's modules share their closures.

    `audited` is where the audited files lie (a prefix, an extraction folder, a .so's folder):
    its files and the target environment's are input, so their search paths are followed only
    inside those two trees.
    """

    def __init__(self, env: TargetEnv, audited: Path):
        self.env = env
        self.roots = tuple(dict.fromkeys(_normal(r) for r in (audited, env.root) if r is not None))
        self._objects: dict[Path, ElfObject] = {}
        self._global: list[ElfObject] | None = None
        self._preloaded: dict[str, ElfObject] | None = None

    def load(self, path: Path) -> ElfObject:
        key = path.resolve()
        if key not in self._objects:
            self._objects[key] = open_elf(path)
        return self._objects[key]

    def close(self) -> None:
        for obj in self._objects.values():
            obj.close()
        self._objects.clear()

    def _inside(self, path: Path) -> bool:
        return any(path.is_relative_to(r) for r in self.roots)

    def _searchable(self, path: Path, requester: ElfObject) -> bool:
        # The interpreter a venv points to and the system's libraries are the node's own
        # installation: their search paths are followed as written.
        if not self._inside(_normal(requester.path)):
            return True
        return path.is_absolute() and (self._inside(_normal(path)) or _normal(path) in SYSTEM_DIRS)

    def find_library(self, name: str, requester: ElfObject) -> Path | None:
        if "/" in name:
            path = _expand([name], requester)[0]
            return path if self._searchable(path, requester) and path.is_file() else None
        dirs: list[Path] = []
        if not requester.runpath:
            dirs += _expand(requester.rpath, requester)
        dirs += _expand(requester.runpath, requester)
        dirs = [d for d in dirs if self._searchable(d, requester)]
        dirs += self.env.lib_dirs
        dirs += SYSTEM_DIRS
        for d in dirs:
            candidate = d / name
            if candidate.is_file():
                return candidate
        return None

    def preloaded(self) -> dict[str, ElfObject]:
        """What the process holds when the extension is imported, by soname and file name: the
        interpreter's closure, then the torch libraries `import torch` loaded."""
        if self._preloaded is None:
            self._preloaded = {}  # closures computed below must not look here yet
            loaded = list(self.global_scope())
            torch_libs = policy()["torch_libraries"] if self.env.torch_lib else []
            for name in torch_libs:
                if (self.env.torch_lib / name).is_file():
                    loaded += self.closure(self.load(self.env.torch_lib / name))[0]
            preloaded: dict[str, ElfObject] = {}
            for obj in loaded:
                for key in (obj.soname, obj.path.name):
                    if key:
                        preloaded.setdefault(key, obj)
            self._preloaded = preloaded
        return self._preloaded

    def closure(self, root: ElfObject) -> tuple[list[ElfObject], list[tuple[str, str]]]:
        order = [root]
        seen = {root.path.resolve()}
        names_seen: set[str] = set()
        missing: list[tuple[str, str]] = []
        queue = deque([root])
        while queue:
            obj = queue.popleft()
            for name in obj.needed:
                if name in names_seen:  # the loader matches an already loaded SONAME
                    continue
                names_seen.add(name)
                lib = self.preloaded().get(name)
                if lib is None:
                    path = self.find_library(name, obj)
                    if path is None:
                        missing.append((name, obj.path.name))
                        continue
                    lib = self.load(path)
                if lib.path.resolve() in seen:
                    continue
                seen.add(lib.path.resolve())
                order.append(lib)
                queue.append(lib)
        return order, missing

    def global_scope(self) -> list[ElfObject]:
        if self._global is None:
            self._global = []
            if self.env.interpreter is not None:
                self._global, _ = self.closure(self.load(self.env.interpreter))
        return self._global

    def resolve(self, module: ElfObject) -> Resolution:
        closure, missing = self.closure(module)
        scope = [o for o in self.global_scope() + closure[1:]]
        unresolved: list[Symbol] = []
        assumed: list[Symbol] = []
        for sym in module.undefined:
            if sym.weak or _defined_in(sym, scope):
                continue
            if self.env.interpreter is None and is_interpreter_symbol(sym.name):
                assumed.append(sym)
            else:
                unresolved.append(sym)
        return Resolution(closure, missing, unresolved, assumed)


def _normal(path: Path) -> Path:
    """Absolute and without `..`, symlinks left as they are (the loader does not resolve them
    before it searches)."""
    return Path(os.path.normpath(Path(path).absolute()))


def _expand(paths: list[str], requester: ElfObject) -> list[Path]:
    """The loader's substitutions: $ORIGIN / ${ORIGIN} and $LIB / ${LIB}, as whole names only
    (`$ORIGINAL` is no token)."""
    values = {"ORIGIN": str(requester.path.parent), "LIB": "lib64" if "64" in platform.machine() else "lib"}
    return [Path(_DST.sub(lambda m: values[m.group(1) or m.group(2)], p)) for p in paths]


_DST = re.compile(r"\$\{(ORIGIN|LIB)\}|\$(ORIGIN|LIB)(?![A-Za-z0-9_])")


def _defined_in(sym: Symbol, scope: list[ElfObject]) -> bool:
    for obj in scope:
        definitions = obj.lookup(sym.name)
        if not definitions:
            continue
        if sym.version is None:
            # An unversioned reference binds to the default definition (name@@VER or unversioned).
            if any(not hidden for _v, hidden in definitions):
                return True
        elif any(v == sym.version for v, _h in definitions) or (
            not obj.version_defs and sym.from_file in (obj.soname, obj.path.name)
        ):
            return True
    return False
