"""`extforge publish --wheels DIR`: the wheels of audited conda packages, into the wheel index.

Each package passes the channel's gate first (its audit against the pytorch it pins, from the
upstream channel); its wheel is then derived from it (the same bytes `extforge build --wheel`
wrote, the wheel being reproducible) and audited itself against that same torch, as pip's
layout holds it, before the index takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..archive import check_package
from ..audit import audit_target
from ..audit.channel_target import pinned_torch_prefix
from ..channel.publish import audit_gate
from ..channel_ref import channel_url
from ..errors import ExtforgeError
from ..paths import scratch_dir
from .index import WheelPublish, publish_wheels
from .make import Wheel, wheel_from_conda
from .requirements import torch_dep


def publish_conda_wheels(packages: Sequence[Path], index: Path, *, upstream: Sequence[str],
                         manylinux: tuple[int, int] | None = None, audit: bool = True) -> WheelPublish:
    """Publish the wheel of each conda package in `packages` into the wheel index folder `index`;
    `upstream`: the channels holding the pytorch they pin."""
    if not upstream:
        raise ExtforgeError("no channel to take the packages' pinned torch from",
                            "a wheel is audited against, and its search paths found in, the torch it pins",
                            "pass --upstream CHANNEL (the channel the packages were built against), or --channel DIR")
    channels = [channel_url(u) for u in upstream]
    with scratch_dir("wheels") as tmp:
        made: list[tuple[Wheel, str]] = []
        for package in map(Path, packages):
            if not package.name.endswith((".conda", ".tar.bz2")) or not package.is_file():
                raise ExtforgeError(f"{package} is not a conda package file",
                                    "--wheels derives each wheel from the audited conda package", "pass the .conda files built")
            verdict = "skipped"
            if audit:
                gate = audit_gate(package, channels)
                if not gate.ok:
                    raise ExtforgeError(f"package {package.name} failed its audit (verdict {gate.verdict})",
                                        "a wheel of a package that fails the binary audit can crash or mis-run in every venv",
                                        f"fix the build; `extforge audit {package} --channel {channels[0]}` shows why", exit_code=1)
                verdict = gate.verdict
            depends = [str(d) for d in check_package(package).index.get("depends", [])]
            torch_dep(depends, package.name)  # refused here, before a torch is solved, if it names no torch version
            torch = pinned_torch_prefix(depends, channels)
            wheel = wheel_from_conda(package, tmp, torch, manylinux=manylinux)
            if audit:
                report = audit_target(wheel.path, against=torch)
                if not report.ok:
                    first = next((f for f in report.findings if f.severity == "error"), None)
                    raise ExtforgeError(f"the wheel {wheel.path.name} failed its audit against {torch}",
                                        first.message if first else f"verdict {report.verdict}",
                                        f"run `extforge audit WHEEL --against {torch}` on a wheel made with "
                                        "`extforge build --wheel` for every finding", exit_code=1)
            made.append((wheel, verdict))
        return publish_wheels(made, index)
