"""`extforge mirror`: a local upstream channel with conda-forge's package names, built offline.

Public API: build_mirror(channel, inputs, extras) -> MirrorResult, with inputs from
inputs.from_env / from_wheels / from_pip.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import engine
from ..ui import log
from . import rows
from .builder import CachedPackage, build_jobs, place
from .cuda_sources import add_wheel_headers, toolkit_for
from .cuda_toolkit import toolkit_jobs
from .deps import closure, marker_environment
from .inputs import MirrorInputs, from_env, from_pip, from_wheels
from .python_pkg import python_abi_job, python_job
from .recipes import PackageJob
from .toolchain import Toolchain, compiler_jobs, detect
from .torch_pkg import as_pytorch, find_torch, torch_facts
from .wheels import dist_job

__all__ = ["MirrorResult", "build_mirror", "from_env", "from_pip", "from_wheels", "pip_requirements", "plan_jobs"]

# What conda-forge-style CUDA extension recipes put in build/host besides the compilers.
BASE_DISTS = ("torch", "pip", "setuptools", "wheel", "packaging", "ninja")
# What conda-forge's pytorch requires and pip's torch does not: without numpy, every
# `import torch` warns "Failed to initialize NumPy".
TORCH_RUN_DISTS = ("numpy",)
VARIANTS_FILE = "variants.yaml"


@dataclass
class MirrorResult:
    channel: Path
    variants: dict[str, str]
    variants_file: Path
    packages: list[CachedPackage]
    missing: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "channel": str(self.channel),
            "channel_url": self.channel.resolve().as_uri(),
            "variants_file": str(self.variants_file),
            "variants": self.variants,
            "seconds": round(self.seconds, 1),
            "built": sum(not p.cached for p in self.packages),
            "cached": sum(p.cached for p in self.packages),
            "missing_dependencies": self.missing,
            "packages": [
                {
                    "name": p.name,
                    "version": p.version,
                    "build": p.build,
                    "subdir": p.subdir,
                    "file": str(self.channel / p.subdir / p.path.name),
                    "cached": p.cached,
                    "seconds": round(p.seconds, 1),
                }
                for p in self.packages
            ],
        }


def plan_jobs(
    inputs: MirrorInputs, extras: list[str], toolchain: Toolchain, cuda_home: str | None = None
) -> tuple[list[PackageJob], dict[str, str], dict[str, str]]:
    """Every package of the channel, the variant values it satisfies, and dependencies not found.

    The CUDA toolkit is chosen for the torch (cuda_sources.toolkit_for): the one at `cuda_home`
    when given, else one the mirror can fetch."""
    torch = find_torch(inputs)
    facts = torch_facts(torch)
    interp = inputs.interpreter
    env = marker_environment(interp.short, interp.version)
    runs = [d for d in TORCH_RUN_DISTS if d in inputs.artifacts]
    roots = [r for r in BASE_DISTS if r == "torch" or r in inputs.artifacts] + runs + list(extras)
    graph = closure(roots, {k: a.info for k, a in inputs.artifacts.items()}, env)
    jobs = [python_job(interp), python_abi_job(interp)]
    for name in graph.order:
        job = dist_job(inputs.artifacts[name], graph.depends[name], interp)
        if name == "torch":
            job = as_pytorch(job, facts, interp.short, numpy="numpy" in runs)
        jobs.append(job)
    jobs += compiler_jobs(toolchain)
    toolkit = None
    if facts.cuda:
        toolkit = toolkit_for(facts.cuda, cuda_home)
        if toolkit.source == "host":
            toolkit = add_wheel_headers(toolkit, inputs)
        jobs += toolkit_jobs(toolkit, toolchain.gxx)
    variants = {
        "python": interp.short,
        "pytorch": torch.version.split("+")[0],
        # Not a conda-forge key: torch 2.6 exists with both C++ ABIs, and extensions name theirs.
        "cxx_abi": facts.abi_tag,
        "c_compiler": "gcc",
        "c_compiler_version": toolchain.gcc_major,
        "cxx_compiler": "gxx",
        "cxx_compiler_version": toolchain.gcc_major,
    }
    if toolkit:
        variants |= {"cuda_compiler": "cuda-nvcc", "cuda_compiler_version": toolkit.short}
    missing = {k: v for k, v in graph.missing.items() if k not in BASE_DISTS or k == "torch"}
    missing |= {d: "pytorch: `import torch` warns without it" for d in TORCH_RUN_DISTS if d not in runs}
    return jobs, variants, missing


def pip_requirements(torch_spec: str, extras: list[str]) -> list[str]:
    return [torch_spec, *(d for d in BASE_DISTS if d != "torch"), *TORCH_RUN_DISTS, *extras]


def build_mirror(
    channel: Path,
    inputs: MirrorInputs,
    extras: list[str] = (),  # type: ignore[assignment]
    *,
    toolchain: Toolchain | None = None,
    cuda_home: str | None = None,
    on_package: Callable[[PackageJob, CachedPackage | None], None] | None = None,
) -> MirrorResult:
    """Build (or take from the cache) every package and write an indexed channel at `channel`."""
    start = time.monotonic()
    engine.prepare_environment()
    jobs, variants, missing = plan_jobs(inputs, list(extras), toolchain or detect(), cuda_home)
    for name, asked_by in missing.items():
        log.warning("%s (needed by %s) is not in %s; left out of the channel", name, asked_by, inputs.description)
    channel.mkdir(parents=True, exist_ok=True)
    # This run's row replaces its earlier self; the channel's other torch builds stay (read first:
    # a rows file that cannot be read stops the run before any package is built).
    before = rows.load_rows(channel)
    log_file = channel / "mirror-build.log"
    built = build_jobs(jobs, log_file, on_package)
    after = rows.merge(before, rows.Row(variants, [f"{p.subdir}/{p.path.name}" for p in built]))
    place(built, channel, remove=rows.stale_files(before, after))
    for name, text in ((rows.ROWS_FILE, rows.rows_json(after)), (VARIANTS_FILE, rows.variants_yaml(after))):
        tmp = channel / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o644)
        tmp.replace(channel / name)
    return MirrorResult(channel, variants, channel / VARIANTS_FILE, built, missing, time.monotonic() - start)
