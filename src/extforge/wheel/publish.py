"""`extforge publish --wheels DIR`: the wheels of audited conda packages, into the wheel index.

Each package passes the channel's gate first (its audit against the pytorch it pins, from the
upstream channel); its wheel is then derived from it (the same bytes `extforge build --wheel`
wrote, the wheel being reproducible) and audited itself against that same torch, as pip's
layout holds it, before the index takes it. A package requiring another that extforge builds per
torch (mamba-ssm, causal-conv1d) comes after it, and its wheel pins the version the row serves:
one published before, or one of the same command.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..archive import PackageMeta, check_package
from ..audit import audit_target
from ..audit.channel_target import pinned_torch_prefix
from ..channel_ref import channel_url
from ..errors import ExtforgeError
from ..paths import scratch_dir
from ..publishing.publish import audit_gate
from .index import WheelPublish, project_name, publish_wheels, served_versions
from .make import Wheel, wheel_from_conda
from .requirements import Dep, torch_dep


def _read(packages: Sequence[Path]) -> list[tuple[Path, PackageMeta]]:
    """Each package file checked and read, those another of them requires first."""
    metas = []
    for package in map(Path, packages):
        if not package.name.endswith((".conda", ".tar.bz2")) or not package.is_file():
            raise ExtforgeError(f"{package} is not a conda package file",
                                "--wheels derives each wheel from the audited conda package", "pass the .conda files built")
        metas.append((package, check_package(package)))
    needs = {package: {Dep.parse(str(d)).name for d in meta.index.get("depends", [])} - {meta.name} for package, meta in metas}
    ordered: list[tuple[Path, PackageMeta]] = []
    while metas:
        left = {meta.name for _, meta in metas}
        ready = [(p, meta) for p, meta in metas if not needs[p] & left] or metas[:1]  # metas[:1]: a cycle, in no order
        ordered += ready
        metas = [m for m in metas if m not in ready]
    return ordered


def publish_conda_wheels(packages: Sequence[Path], index: Path, *, upstream: Sequence[str],
                         manylinux: tuple[int, int] | None = None, audit: bool = True) -> WheelPublish:
    """Publish the wheel of each conda package in `packages` into the wheel index folder `index`;
    `upstream`: the channels holding the pytorch they pin."""
    if not upstream:
        raise ExtforgeError("no channel to take the packages' pinned torch from",
                            "a wheel is audited against, and its search paths found in, the torch it pins",
                            "pass --upstream CHANNEL (the channel the packages were built against), or --channel DIR")
    channels = [channel_url(u) for u in upstream]
    served = served_versions(index)
    with scratch_dir("wheels") as tmp:
        made: list[tuple[Wheel, str]] = []
        for package, meta in _read(packages):
            verdict = "skipped"
            if audit:
                gate = audit_gate(package, channels)
                if not gate.ok:
                    raise ExtforgeError(f"package {package.name} failed its audit (verdict {gate.verdict})",
                                        "a wheel of a package that fails the binary audit can crash or mis-run in every venv",
                                        f"fix the build; `extforge audit {package} --channel {channels[0]}` shows why", exit_code=1)
                verdict = gate.verdict
            depends = [str(d) for d in meta.index.get("depends", [])]
            torch_dep(depends, package.name)  # refused here, before a torch is solved, if it names no torch version
            torch = pinned_torch_prefix(depends, channels)
            wheel = wheel_from_conda(package, tmp, torch, manylinux=manylinux, served=served)
            if audit:
                report = audit_target(wheel.path, against=torch)
                if not report.ok:
                    first = next((f for f in report.findings if f.severity == "error"), None)
                    raise ExtforgeError(f"the wheel {wheel.path.name} failed its audit against {torch}",
                                        first.message if first else f"verdict {report.verdict}",
                                        f"run `extforge audit WHEEL --against {torch}` on a wheel made with "
                                        "`extforge build --wheel` for every finding", exit_code=1)
            made.append((wheel, verdict))
            served.setdefault(wheel.torch.row, {}).setdefault(project_name(wheel.project), []).append(wheel.version)
        return publish_wheels(made, index)
