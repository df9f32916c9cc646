"""Node admission: can this node run the environment's CUDA extensions? Pure logic over the
audit records in the prefix (share/extforge/audit/*.json) and the node's facts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..audit.fatbin import arch_runs_on
from ..doctor.model import Gpu
from .node import NodeFacts

AUDIT_DIR = "share/extforge/audit"


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # "pass" | "fail" | "skip"
    summary: str
    findings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "summary": self.summary, "findings": list(self.findings)}


def read_audit_records(prefix: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((prefix / AUDIT_DIR).glob("*.json"))]


def _v(text: str | None) -> Version | None:
    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None


def gpu_covered(record: dict, gpu: Gpu) -> bool:
    return any(arch_runs_on(a, gpu.compute_cap) for a in record.get("sass_archs", [])) or any(
        arch_runs_on(a, gpu.compute_cap, ptx=True) for a in record.get("ptx_archs", [])
    )


def required_cuda(records: list[dict], env_cuda: str | None) -> str | None:
    candidates = [v for v in [env_cuda, *(r.get("cuda_version") for r in records)] if _v(v)]
    return max(candidates, key=_v) if candidates else None


def check_driver_cuda(node: NodeFacts, need: str | None) -> Check:
    if not need:
        return Check("driver-cuda", "skip", "the environment needs no CUDA version")
    d = node.driver
    if not d.max_cuda:
        return Check("driver-cuda", "skip", f"no CUDA driver facts on this node ({d.source}); the environment needs CUDA {need}")
    ok = _v(d.max_cuda) >= _v(need)
    summary = f"driver {d.driver_version or '?'} supports CUDA {d.max_cuda}, the environment needs {need}"
    return Check("driver-cuda", "pass" if ok else "fail", summary, () if ok else (f"update the driver to one supporting CUDA {need}",))


def check_gpu_arch(node: NodeFacts, records: list[dict]) -> Check:
    if not records:
        return Check("gpu-arch", "skip", "no extension audit records in the prefix")
    if not node.gpus:
        return Check("gpu-arch", "skip", "no GPU on this node")
    findings = tuple(
        f"{r['name']} {r.get('version', '')} has no code for GPU {i} ({g.name}, {g.sm}): "
        f"sass {r.get('sass_archs', [])}, ptx {r.get('ptx_archs', [])}"
        for r in records
        for i, g in enumerate(node.gpus)
        if not gpu_covered(r, g)
    )
    caps = sorted({g.compute_cap for g in node.gpus})
    summary = f"{len(records)} extension(s) vs GPU capability {', '.join(caps)}"
    return Check("gpu-arch", "fail" if findings else "pass", summary, findings)


def check_glibc(node: NodeFacts, records: list[dict]) -> Check:
    floors = [(r["name"], r["glibc_floor"]) for r in records if _v(r.get("glibc_floor"))]
    if not floors:
        return Check("glibc", "skip", "no glibc floor recorded")
    if not node.glibc:
        return Check("glibc", "fail", "this node's glibc could not be determined", ("is this a musl-based system?",))
    findings = tuple(f"{n} needs glibc {f}, node has {node.glibc}" for n, f in floors if _v(f) > _v(node.glibc))
    top = max((f for _, f in floors), key=_v)
    return Check("glibc", "fail" if findings else "pass", f"node glibc {node.glibc}, highest floor {top}", findings)


def admission_checks(records: list[dict], node: NodeFacts, env_cuda: str | None) -> list[Check]:
    return [
        check_driver_cuda(node, required_cuda(records, env_cuda)),
        check_gpu_arch(node, records),
        check_glibc(node, records),
    ]
