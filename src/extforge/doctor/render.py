"""The human-readable doctor report."""

from __future__ import annotations

from ..machine import GIB
from .checks import build_nvcc
from .model import DoctorReport, Facts


def _facts_lines(f: Facts) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if f.python:
        p = f.python
        rows.append(("python", f"{p.version} ({p.tag}, {p.soabi}) {p.executable}"))
    if f.torch:
        t = f.torch
        rows.append(("torch", f"{t.version}, CUDA {t.cuda or 'none (CPU build)'}, CXX11 ABI {int(t.cxx11_abi)}"))
        if t.arch_list:
            rows.append(("torch archs", " ".join(t.arch_list)))
    else:
        rows.append(("torch", "not found"))
    used = build_nvcc(f)
    for n in f.nvccs:
        mark = "  ← builds use this" if n is used else ""
        real = f" → {n.real_path}" if n.real_path else ""
        rows.append(("nvcc", f"{n.version or '?'} {n.path}{real} (via {', '.join(n.found_via)}){mark}"))
    if not f.nvccs:
        rows.append(("nvcc", "none found"))
    if f.cuda_home:
        h = f.cuda_home
        headers = "" if h.has_headers or not h.path else ", no include/cuda_runtime.h"
        rows.append(("CUDA_HOME", f"{h.path or 'none'} (torch's choice, from {h.reason}{headers})"))
    if f.driver:
        d = f.driver
        if d.driver_version:
            rows.append(("driver", f"{d.driver_version}, CUDA up to {d.max_cuda or '?'} ({d.source})"))
        else:
            rows.append(("driver", d.source))
        for i, g in enumerate(d.gpus):
            rows.append((f"GPU {i}", f"{g.name}, compute capability {g.compute_cap} ({g.sm})"))
    if f.compiler:
        c = f.compiler
        abi = "?" if c.default_cxx11_abi is None else str(int(c.default_cxx11_abi))
        rows.append(("compiler", f"{c.command} = {c.path or 'not found'}: {c.version_line or '?'}; default CXX11 ABI {abi}"))
    if f.compile_cache:
        cc = f.compile_cache
        if cc.use in ("private", "per-user"):
            how = f"{cc.tool}: {cc.path}, {cc.use}" + (f" ({cc.why})" if cc.why else "")
            # Not the machine's TCP port, where another user's server may be listening.
            how += "; its server listens on a socket in that folder" if cc.tool == "sccache" else ""
        else:
            how = f"{cc.tool + ': ' if cc.tool else ''}{cc.use}: {cc.why}"
        rows.append(("compile cache", how))
    if f.cores is not None and f.memory_bytes is not None:
        rows.append(
            ("machine", f"glibc {f.glibc or '?'}, {f.cores} cores, {f.memory_bytes / GIB:.1f} GiB ({f.memory_source})")
        )
    if f.plan:
        peak = f.plan.get("predicted_peak_bytes")
        limit = f.plan.get("memory_limit_bytes")
        fit = f" (predicted peak {peak / GIB:.1f} GiB of {limit / GIB:.1f} GiB allowed)" if peak and limit else ""
        archs = f" for sm_{', sm_'.join(f.plan['archs'])}" if f.plan.get("archs") else ""
        rows.append(("planner", " ".join(f"{k}={v}" for k, v in f.plan.items() if k.isupper()) + archs + fit))
    for ext in f.extensions:
        how = f"conda {ext.conda_build} from {ext.conda_channel}" if ext.installer == "conda" else ext.installer
        tags = f", wheel tags {' '.join(ext.wheel_tags)}" if ext.wheel_tags else ""
        rows.append((ext.name, f"{ext.version} ({how}{tags}) in {ext.location}"))
        rows.append(("  extension", ext.extension or f"{ext.module} missing"))
        if ext.audit_verdict:
            rows.append(("  audit", ext.audit_verdict))
    return rows


def render(report: DoctorReport, verbose: bool = False) -> str:
    rows = _facts_lines(report.facts)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if report.findings:
        lines += ["", "findings:"]
        for fd in report.findings:
            lines.append(f"  {fd.severity}: {fd.title}")
            lines.append(f"    cause: {fd.cause}")
            if fd.fix:
                lines.append(f"    fix:   {fd.fix}")
    else:
        lines += ["", "no findings"]
    if report.facts.not_checked:
        lines += ["", "not checked:"] + [f"  - {n}" for n in report.facts.not_checked]
    return "\n".join(lines)
