"""`extforge audit`: prove a binary matches its target environment before it is published.

Public entry points: audit_target / audit_package (the build and publish gates),
extforge.stamp holds the audit metadata written into packages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExtforgeError
from .channel_target import admits, build_env_mismatch, channel_torches, exact_spec, pinned_torch_prefix, torch_specs
from .checks import Context, audit_module
from .packaging import (
    Payload,
    is_extension_module,
    open_target,
    packaging_findings,
    pinned_glibc,
)
from .platforms import SUBDIRS, host_subdir, runs_on, wheel_subdir
from .policy import arch_names, parse_glibc
from .report import AuditReport, Finding, ModuleFacts
from .resolve import Resolver, TargetEnv, target_env
from .search_paths import placement
from .wheel_target import tag_glibc, wheel_findings

__all__ = ["AuditReport", "Finding", "ModuleFacts", "TorchVerdict", "audit_every_torch", "audit_package", "audit_target"]


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
    archs, glibc = _checked_options(archs, glibc)
    with open_target(target) as payload:
        return _audit_payload(payload, target, start, against=against, archs=archs, glibc=glibc, channel=channel,
                              build_env=build_env)


def _checked_options(archs: list[str] | None, glibc: str | None) -> tuple[list[str] | None, str | None]:
    try:
        return (arch_names(",".join(archs)) if archs else archs), (parse_glibc(glibc) if glibc else glibc)
    except ValueError as exc:
        raise ExtforgeError("invalid audit options", str(exc), "pass --archs like sm_80,sm_90 and --glibc like 2.28") from exc


def _audit_payload(
    payload: Payload,
    target: Path,
    start: float,
    *,
    against: Path | None,
    archs: list[str] | None,
    glibc: str | None,
    channel: str | Sequence[str] | None,
    build_env: Path | None,
) -> AuditReport:
    """audit_target on a target already opened (extracted once, audited against several envs)."""
    source, pin_findings = ("given" if against else None), []
    if against is None and payload.kind == "prefix":
        against, source = payload.root, "prefix"
    if against is None and payload.kind == "conda" and build_env is not None:
        if mismatch := build_env_mismatch(build_env, payload.depends):
            pin_findings.append(Finding(
                "error", "packaging", mismatch,
                cause="the run requirement on pytorch is not taken from the host pytorch, so users "
                      "get a torch the module was never linked against",
                fix="build against a pytorch that exports its exact pin (an `extforge mirror` channel's does), or "
                    "pin it from the host in the recipe: run: ${{ pin_compatible('pytorch', exact=True) }}"))
        else:
            against, source = build_env, "build"
    if against is None and payload.kind == "conda" and channel:
        # A package that pins no torch (pure Python, a plain C library) has no torch to fetch.
        if torch_specs(payload.depends):
            against, source = pinned_torch_prefix(payload.depends, channel), "channel"
    env = target_env(Path(against) if against else None)
    report = AuditReport(
        target=str(target), against=str(against) if against else None, against_source=source, against_kind=env.kind,
        name=payload.name, version=payload.version, build=payload.build, torch=env.torch,
        cuda_version=env.cuda_version,
    )
    report.extend(pin_findings)
    report.extend(packaging_findings(payload))
    # A wheel's manylinux tag is its promise of the oldest glibc (and that glibc's libstdc++) it runs on.
    floor = glibc or pinned_glibc(payload.depends) or tag_glibc(payload.wheel_tags)
    resolver = Resolver(env, payload.root)
    subdir = report.platform = _target_subdir(payload, env, resolver)
    report.extend(_platform_findings(payload, subdir))
    recorded = recorded_archs(payload.root) if archs is None and payload.kind == "conda" else None
    ctx = Context(env=env, resolver=resolver, archs=archs or recorded, glibc=floor, subdir=subdir,
                  exact_archs=recorded is not None, wheel=payload.kind == "wheel")
    try:
        for path in payload.elf_files:
            rel = payload.relative(path)
            where = placement(payload.kind, rel, payload.root, env.root, payload.placeholders.get(rel))
            result = audit_module(ctx, resolver.load(path), rel, is_extension_module(path), where)
            report.modules.append(result.facts)
            report.extend(result.findings)
            if report.target_cxx11_abi is None:
                report.target_cxx11_abi = result.target_cxx11_abi
    finally:
        resolver.close()
    if payload.kind == "wheel":
        report.extend(wheel_findings(payload.name, payload.version, payload.wheel_tags, payload.requires_dist, env,
                                     report.target_cxx11_abi))
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


def recorded_archs(root: Path) -> list[str] | None:
    """The exact code list ("sm_90", "compute_90") a package's build record says extforge's build
    layer compiled for (share/extforge/build/<name>.json, key `layer`); None: no such record."""
    for record in sorted((root / "share" / "extforge" / "build").glob("*.json")):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("layer") and isinstance(data.get("cuda_archs"), list):
            return [str(a) for a in data["cuda_archs"] if a] or None
    return None


def _target_subdir(payload: Payload, env: TargetEnv, resolver: Resolver) -> str | None:
    """The platform the modules must run on: the one a package declares, else the target
    environment's (its python's machine), else the auditing machine's."""
    if payload.kind == "conda":
        return payload.subdir
    if payload.kind == "wheel":
        return next((s for s in map(wheel_subdir, payload.wheel_tags) if s), None)
    if env.interpreter is not None:
        python = resolver.load(env.interpreter)
        return next((name for name in SUBDIRS if runs_on(name, python.machine, python.elfclass, python.little_endian)),
                    host_subdir())
    return host_subdir()


def _platform_findings(payload: Payload, subdir: str | None) -> list[Finding]:
    if not payload.elf_files or subdir in SUBDIRS or payload.kind == "wheel":
        return []
    if subdir == "noarch":
        return [Finding("error", "platform", f"{payload.source.name} is a noarch package but ships machine code",
                        cause="noarch packages install on every platform; its ELF files run on one",
                        fix="build it per platform (drop `noarch:` from the recipe)")]
    said = f"declares platform {subdir!r}" if subdir else "declares no platform (no subdir in info/index.json)"
    return [Finding("error", "platform", f"{payload.source.name} {said}, none of {', '.join(SUBDIRS)}",
                    cause="its machine code cannot be checked against the platform it installs on",
                    fix="rebuild it with rattler-build for a Linux platform")]


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


@dataclass(frozen=True)
class TorchVerdict:
    """One torch build of a channel: may a user get the package beside it, and does it work there."""

    torch: str  # "pytorch 2.11.0 cuda130_py312_h..._0"
    refused: str | None  # why the package's run requirements exclude this torch; None: admitted
    report: AuditReport

    @property
    def ok(self) -> bool:
        """An admitted torch must pass; an excluded one may fail (that is why it is excluded)."""
        return self.refused is not None or self.report.ok


def audit_every_torch(
    package: Path, channels: Sequence[str], *, archs: list[str] | None = None, glibc: str | None = None,
) -> list[TorchVerdict]:
    """The package audited against every torch build the channels hold, each beside whether its
    run requirements admit that torch: the proof that one build (a stable-ABI extension) serves
    exactly the torches it says it serves."""
    archs, glibc = _checked_options(archs, glibc)
    # Extracted once for all torches (flash-attn's package is ~0.5 GB unpacked).
    with open_target(package) as payload:
        if payload.kind != "conda":
            raise ExtforgeError(f"--every-torch needs a conda package, not {package.name}",
                                "only a package has run requirements that admit or exclude a torch",
                                "pass the built .conda file")
        torches = channel_torches(channels)
        if not torches:
            raise ExtforgeError(f"no pytorch package in {', '.join(channels)}",
                                "there is no torch build to audit the package against",
                                "pass the channel(s) your users install torch from (e.g. the mirror channel)")
        verdicts = []
        for torch in torches:
            start = time.monotonic()
            prefix = pinned_torch_prefix([exact_spec(torch)], channels)
            verdicts.append(TorchVerdict(
                f"{torch['name']} {torch['version']} {torch['build']}", admits(payload.depends, torch, channels),
                _audit_payload(payload, package, start, against=prefix, archs=archs, glibc=glibc, channel=None,
                               build_env=None)))
        return verdicts
