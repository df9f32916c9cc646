"""`extforge doctor`: probe this machine and a Python environment, say what breaks CUDA extensions.

Each probe is a pure parser of a real output format (nvcc --version, nvidia-smi, the compiler's
predefined macros) plus a thin runner; the target Python is asked in a subprocess, so extforge
never imports torch. `diagnose` turns the facts into findings with the command that fixes each.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import compile_cache
from .. import machine as machine_mod
from ..audit import audit_target
from ..errors import ExtforgeError
from ..planning.plan import UNMEASURED, plan_build
from .checks import diagnose
from .compiler import probe_compiler
from .driver import probe_driver
from .extensions import ExtensionSpec, known
from .model import CompileCacheFacts, DoctorReport, ExtensionFacts, Facts, Finding
from .nvcc import DEFAULT_TOOLKIT_GLOBS, find_nvccs, torch_cuda_home
from .target import probe_target

__all__ = ["DoctorReport", "Facts", "Finding", "diagnose", "planner_values", "run_doctor"]


def planner_values(m: machine_mod.Machine, archs: Sequence[str] = ()) -> tuple[dict[str, Any] | None, str | None]:
    """What the build planner would choose on this machine for an extension nobody measured yet
    (for `archs`, else the default list), or why it cannot say."""
    try:
        plan = plan_build(m, UNMEASURED, archs=tuple(archs))
        values: dict[str, Any] = dict(plan.job_env())
        values["archs"] = list(plan.archs)
        for key in ("predicted_peak_bytes", "memory_limit_bytes", "expected_wall_seconds"):
            values[key] = getattr(plan, key)
        return values, None
    except Exception as exc:  # the planner is advisory here; doctor still reports the rest
        return None, f"planner unavailable ({type(exc).__name__}: {exc})"


def probe_compile_cache() -> CompileCacheFacts:
    """Where `extforge build` would keep this user's compile cache, judged without making anything."""
    try:
        place = compile_cache.placement(compile_cache.find_launcher().tool)
    except ExtforgeError as exc:  # neither tool on PATH, or an unusable EXTFORGE_CACHE
        return CompileCacheFacts(None, None, "none", exc.what)
    refusal = compile_cache.refused(place)
    if refusal:
        return CompileCacheFacts(place.tool, str(place.path), "refused", refusal.what, refusal.fix)
    return CompileCacheFacts(place.tool, str(place.path), "private" if place.shared is None else "per-user",
                             place.shared or "")


def _audit(ext: ExtensionFacts, prefix: str) -> tuple[ExtensionFacts, str | None]:
    if not ext.extension:
        return ext, None
    try:
        report = audit_target(Path(ext.extension), against=Path(prefix))
    except Exception as exc:
        return ext, f"{ext.name} audit: {type(exc).__name__}: {exc}"
    problems = tuple(
        str(getattr(f, "message", f))
        for f in getattr(report, "findings", ())
        if getattr(f, "severity", "error") == "error"
    )
    verdict = getattr(report, "verdict", None) or ("pass" if getattr(report, "ok", False) else "fail")
    return dataclasses.replace(ext, audit_verdict=str(verdict), audit_problems=problems), None


def run_doctor(
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    toolkit_globs: Sequence[str] = DEFAULT_TOOLKIT_GLOBS,
    proc_driver: Path = Path("/proc/driver/nvidia/version"),
    audit: bool = True,
    extensions: Sequence[ExtensionSpec] | None = None,
) -> DoctorReport:
    """`extensions`: the installed packages to look for (default: data/doctor-extensions.yaml's)."""
    env = dict(os.environ if env is None else env)
    python = python or sys.executable
    facts = Facts()
    wanted = known() if extensions is None else tuple(extensions)
    # The target probe imports torch (seconds); the other probes run meanwhile.
    with ThreadPoolExecutor(max_workers=4) as pool:
        target = pool.submit(probe_target, python, wanted)
        nvccs = pool.submit(find_nvccs, env, toolkit_globs)
        driver = pool.submit(probe_driver, env, proc_driver)
        compiler = pool.submit(probe_compiler, env)
        m = machine_mod.detect()
        facts.glibc, facts.cores = m.glibc, m.cores
        facts.memory_bytes, facts.memory_source = m.memory_bytes, m.memory_source
        facts.cuda_home = torch_cuda_home(env)
        facts.compile_cache = probe_compile_cache()
        facts.nvccs, facts.driver, facts.compiler = nvccs.result(), driver.result(), compiler.result()
        # A node builds for its own GPUs: plan for those archs, as `extforge plan --archs` would.
        own_archs = sorted({g.compute_cap.replace(".", "") for g in facts.driver.gpus})
        facts.plan, why = planner_values(m, own_archs)
        if why:
            facts.not_checked.append(why)
        t = target.result()
    facts.python, facts.torch = t.python, t.torch
    for what, err in t.errors.items():
        facts.not_checked.append(f"{what}: not importable in {python} ({err})")
    if facts.driver.driver_version is None:
        facts.not_checked.append("GPUs, driver/CUDA compatibility: no NVIDIA driver")
    installed = {e.name for e in t.extensions}
    facts.not_checked += [f"{w.name}: not installed" for w in wanted if w.name not in installed and w.name not in t.errors]
    for ext in t.extensions:
        if not audit:
            facts.extensions.append(ext)
        elif facts.torch is None:
            facts.extensions.append(ext)
            facts.not_checked.append(f"{ext.name} audit: needs torch")
        else:
            audited, why = _audit(ext, t.python.prefix)
            facts.extensions.append(audited)
            if why:
                facts.not_checked.append(why)
    return DoctorReport(facts, diagnose(facts, wanted))
