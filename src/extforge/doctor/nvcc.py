"""Every nvcc a build could reach, and the one torch.utils.cpp_extension would actually use.

The classic broken cluster setup: a distribution's /usr/bin/nvcc 11.5 comes first on PATH, so
torch derives CUDA_HOME=/usr from it while the right toolkit sits unused in /usr/local/cuda-12.8.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from .model import CudaHome, Nvcc
from .run import run_text

_RELEASE = re.compile(r"release (\d+\.\d+), (V[\d.]+)")

DEFAULT_TOOLKIT_GLOBS = ("/usr/local/cuda", "/usr/local/cuda-*")


def parse_nvcc_version(text: str) -> tuple[str, str] | None:
    """`nvcc --version` output → ("12.8", "V12.8.93"), or None when it is not nvcc's banner."""
    m = _RELEASE.search(text)
    return (m.group(1), m.group(2)) if m else None


def torch_cuda_home(env: Mapping[str, str], default: str = "/usr/local/cuda") -> CudaHome:
    """torch.utils.cpp_extension._find_cuda_home, reproduced without importing torch.

    Order: $CUDA_HOME, $CUDA_PATH, the directory above the first `nvcc` on PATH (no symlink
    resolution, as torch does), then /usr/local/cuda if it exists.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return CudaHome(env[var], var, has_headers(env[var]))
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    if nvcc:
        home = os.path.dirname(os.path.dirname(nvcc))
        return CudaHome(home, f"nvcc on PATH ({nvcc})", has_headers(home))
    if os.path.exists(default):
        return CudaHome(default, default, has_headers(default))
    return CudaHome(None, "no CUDA_HOME, CUDA_PATH, nvcc on PATH or " + default)


def has_headers(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "include", "cuda_runtime.h"))


def toolkit_root(nvcc: str) -> str | None:
    """The toolkit directory behind an nvcc: its grandparent, or that of the resolved path
    (a /usr/local/bin/nvcc symlink or wrapper does not make /usr/local a toolkit)."""
    for path in (nvcc, os.path.realpath(nvcc)):
        root = os.path.dirname(os.path.dirname(path))
        if has_headers(root):
            return root
    return None


def candidate_paths(
    env: Mapping[str, str], toolkit_globs: Sequence[str] = DEFAULT_TOOLKIT_GLOBS
) -> list[tuple[str, str]]:
    """(path, how it was found) for every nvcc binary, PATH order first."""
    found: list[tuple[str, str]] = []
    for i, d in enumerate(p for p in env.get("PATH", "").split(os.pathsep) if p):
        found.append((os.path.join(d, "nvcc"), f"PATH[{i}]"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            found.append((os.path.join(env[var], "bin", "nvcc"), var))
    for pattern in toolkit_globs:
        for d in sorted(glob.glob(pattern)):
            found.append((os.path.join(d, "bin", "nvcc"), pattern))
    return [(p, via) for p, via in found if os.path.isfile(p) and os.access(p, os.X_OK)]


def find_nvccs(env: Mapping[str, str], toolkit_globs: Sequence[str] = DEFAULT_TOOLKIT_GLOBS) -> list[Nvcc]:
    """Each distinct nvcc (by resolved path) with its version; ways of reaching it are merged."""
    by_real: dict[str, tuple[str, list[str]]] = {}
    for path, via in candidate_paths(env, toolkit_globs):
        real = os.path.realpath(path)
        first, vias = by_real.setdefault(real, (path, []))
        if via not in vias:
            vias.append(via)
    items = list(by_real.items())
    # nvcc --version takes ~0.1 s each; a node with five toolkits should not wait in series.
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        outputs = list(pool.map(lambda kv: run_text([kv[1][0], "--version"], env=env, timeout=30), items))
    result = []
    for (real, (path, vias)), out in zip(items, outputs, strict=True):
        parsed = parse_nvcc_version(out.stdout + out.stderr) if out else None
        result.append(
            Nvcc(
                path=path,
                found_via=tuple(vias),
                version=parsed[0] if parsed else None,
                full_version=parsed[1] if parsed else None,
                real_path=real if real != path else None,
                toolkit_root=toolkit_root(path),
            )
        )
    return result
