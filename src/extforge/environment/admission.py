"""Node admission: can this node run the environment's CUDA extensions? Pure logic over the
audit records in the prefix (share/extforge/audit/*.json) and the node's facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `extforge install` takes Check from here without the node's modules (its start-up)
    from packaging.version import Version

    from ..doctor.model import Gpu
    from ..stamp import AuditStamp
    from .node import NodeFacts


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # "pass" | "fail" | "skip"
    summary: str
    findings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "summary": self.summary, "findings": list(self.findings)}


def _v(text: str | None) -> Version | None:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None


def gpu_covered(record: AuditStamp, gpu: Gpu) -> bool:
    from ..fatbin import arch_runs_on

    return any(arch_runs_on(a, gpu.compute_cap) for a in record.sass_archs) or any(
        arch_runs_on(a, gpu.compute_cap, ptx=True) for a in record.ptx_archs
    )


def required_cuda(records: list[AuditStamp], env_cuda: str | None) -> str | None:
    candidates = [(v, t) for t in [env_cuda, *(r.cuda_version for r in records)] if t and (v := _v(t))]
    return max(candidates, key=lambda c: c[0])[1] if candidates else None


def check_driver_cuda(node: NodeFacts, need: str | None) -> Check:
    want = _v(need)
    if not need or want is None:
        return Check("driver-cuda", "skip", "the environment needs no CUDA version")
    d = node.driver
    have = _v(d.max_cuda)
    if have is None:
        return Check("driver-cuda", "skip", f"no CUDA driver facts on this node ({d.source}); the environment needs CUDA {need}")
    ok = have >= want
    summary = f"driver {d.driver_version or '?'} supports CUDA {d.max_cuda}, the environment needs {need}"
    return Check("driver-cuda", "pass" if ok else "fail", summary, () if ok else (f"update the driver to one supporting CUDA {need}",))


def check_gpu_arch(node: NodeFacts, records: list[AuditStamp]) -> Check:
    if not records:
        return Check("gpu-arch", "skip", "no extension audit records in the prefix")
    if not node.gpus:
        return Check("gpu-arch", "skip", "no GPU on this node")
    findings = tuple(
        f"{r.name} {r.version or ''} has no code for GPU {i} ({g.name}, {g.sm}): "
        f"sass {list(r.sass_archs)}, ptx {list(r.ptx_archs)}"
        for r in records
        for i, g in enumerate(node.gpus)
        if not gpu_covered(r, g)
    )
    caps = sorted({g.compute_cap for g in node.gpus})
    summary = f"{len(records)} extension(s) vs GPU capability {', '.join(caps)}"
    return Check("gpu-arch", "fail" if findings else "pass", summary, findings)


def check_glibc(node: NodeFacts, records: list[AuditStamp]) -> Check:
    floors = [(r.name, r.glibc_floor, v) for r in records if r.glibc_floor and (v := _v(r.glibc_floor))]
    if not floors:
        return Check("glibc", "skip", "no glibc floor recorded")
    have = _v(node.glibc)
    if have is None:
        return Check("glibc", "fail", "this node's glibc could not be determined", ("is this a musl-based system?",))
    findings = tuple(f"{n} needs glibc {f}, node has {node.glibc}" for n, f, v in floors if v > have)
    top = max(floors, key=lambda fl: fl[2])[1]
    return Check("glibc", "fail" if findings else "pass", f"node glibc {node.glibc}, highest floor {top}", findings)


def admission_checks(records: list[AuditStamp], node: NodeFacts, env_cuda: str | None) -> list[Check]:
    return [
        check_driver_cuda(node, required_cuda(records, env_cuda)),
        check_gpu_arch(node, records),
        check_glibc(node, records),
    ]
