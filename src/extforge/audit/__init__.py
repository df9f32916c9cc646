"""`extforge audit`: prove a binary matches its target environment before it is published.

Public entry points: audit_target / audit_package (the build and publish gates),
stamp.stamp_package / stamp.read_stamps (audit metadata inside packages).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from .channel_target import build_env_mismatch, pinned_torch_prefix, torch_specs
from .checks import Context, audit_module
from .packaging import (
    is_extension_module,
    open_target,
    packaging_findings,
    pinned_glibc,
)
from .report import AuditReport, Finding, ModuleFacts
from .resolve import Resolver, target_env

__all__ = ["AuditReport", "Finding", "ModuleFacts", "audit_package", "audit_target"]


def audit_target(
    target: Path,
    *,
    against: Path | None = None,
    archs: list[str] | None = None,
    glibc: str | None = None,
    channel: str | Sequence[str] | None = None,
    build_env: Path | None = None,
) -> AuditReport:
    """Audit every ELF file of TARGET (.conda/.tar.bz2, wheel, prefix or .so) against a target env.

    The target env is `against`; else, for a package, the host env of its build (`build_env`)
    if that holds the pytorch the package pins, else its pinned pytorch installed from
    `channel`; else, for a prefix, the prefix itself; else the system libraries alone.
    """
    start = time.monotonic()
    target = Path(target)
    with open_target(target) as payload:
        source, pin_findings = ("given" if against else None), []
        if against is None and payload.kind == "prefix":
            against, source = payload.root, "prefix"
        if against is None and payload.kind == "conda" and build_env is not None:

            if mismatch := build_env_mismatch(build_env, payload.depends):
                pin_findings.append(Finding(
                    "error", "packaging", mismatch,
                    cause="the run requirement on pytorch is not taken from the host pytorch, so users "
                          "get a torch the module was never linked against",
                    fix="pin it from the host in the recipe: run: ${{ pin_compatible('pytorch', exact=True) }}"))
            else:
                against, source = build_env, "build"
        if against is None and payload.kind == "conda" and channel:

            # A package that pins no torch (pure Python, a plain C library) has no torch to fetch.
            if torch_specs(payload.depends):
                against, source = pinned_torch_prefix(payload.depends, channel), "channel"
        env = target_env(Path(against) if against else None)
        report = AuditReport(
            target=str(target), against=str(against) if against else None, against_source=source,
            name=payload.name, version=payload.version, build=payload.build, torch=env.torch,
            cuda_version=env.cuda_version,
        )
        report.extend(pin_findings)
        report.extend(packaging_findings(payload))
        floor = glibc or pinned_glibc(payload.depends)
        resolver = Resolver(env)
        ctx = Context(env=env, resolver=resolver, archs=archs, glibc=floor)
        try:
            for path in payload.elf_files:
                result = audit_module(ctx, resolver.load(path), payload.relative(path), is_extension_module(path))
                report.modules.append(result.facts)
                report.extend(result.findings)
                if report.target_cxx11_abi is None:
                    report.target_cxx11_abi = result.target_cxx11_abi
        finally:
            resolver.close()
    if archs and report.modules and not any(m.sass_archs or m.ptx_archs for m in report.modules):
        report.add(Finding("error", "gpu", f"promised {', '.join(archs)} but no module contains GPU code",
                           cause="the extension was compiled without CUDA (no .nv_fatbin section)",
                           fix="check that nvcc compiled the kernels (FORCE_CUDA=1, CUDA_HOME set)"))
    if floor is None and report.modules:
        needs = ", ".join(f"{k} {v}" for k, v in (("GLIBC", report.floor("GLIBC")),
                                                   ("GLIBCXX", report.floor("GLIBCXX"))) if v)
        report.add(Finding("info", "platform", f"requires {needs or 'no versioned glibc symbols'}; "
                                               "pass --glibc to check a node's floor"))
    report.seconds = time.monotonic() - start
    return report


def audit_package(
    path: Path,
    *,
    against: Path | None = None,
    channel: str | Sequence[str] | None = None,
    build_env: Path | None = None,
    archs: list[str] | None = None,
    glibc: str | None = None,
) -> AuditReport:
    """The gate `extforge build` and `extforge publish` run on a built package; `channel`: the
    channel(s), in priority order, its pinned pytorch comes from."""
    return audit_target(path, against=against, archs=archs, glibc=glibc, channel=channel, build_env=build_env)
