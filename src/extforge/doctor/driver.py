"""The NVIDIA driver: its version, the highest CUDA it supports, and the GPUs with their archs."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from .model import DriverFacts, Gpu
from .run import run_text

GPU_QUERY = ["--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]

# Since R610 the banner says "KMD Version" / "CUDA UMD Version" instead.
_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*([\d.]+)")
_CUDA = re.compile(r"CUDA (?:UMD )?Version:\s*([\d.]+)")
_PROC = re.compile(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)")


def parse_smi_banner(text: str) -> tuple[str | None, str | None]:
    """Plain `nvidia-smi` output → (driver version, highest supported CUDA)."""
    d, c = _DRIVER.search(text), _CUDA.search(text)
    return (d.group(1) if d else None, c.group(1) if c else None)


def parse_gpu_query(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader` → GPUs."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append(Gpu(name=parts[0], compute_cap=parts[1], driver_version=parts[2] if len(parts) > 2 else None))
    return gpus


def parse_proc_version(text: str) -> str | None:
    """/proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 ...")."""
    m = _PROC.search(text)
    return m.group(1) if m else None


def probe_driver(env: Mapping[str, str], proc_version: Path = Path("/proc/driver/nvidia/version")) -> DriverFacts:
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if smi:
        banner = run_text([smi], env=env, timeout=30)
        if banner and banner.returncode == 0:
            driver, cuda = parse_smi_banner(banner.stdout)
            query = run_text([smi, *GPU_QUERY], env=env, timeout=30)
            gpus = parse_gpu_query(query.stdout) if query and query.returncode == 0 else []
            return DriverFacts(driver, cuda, tuple(gpus), source=smi)
        why = (banner.stdout + banner.stderr).strip().splitlines()[:1] if banner else ["did not finish"]
        failed = f"{smi} failed: {why[0] if why else 'no output'}"
    else:
        failed = "nvidia-smi not on PATH"
    try:
        version = parse_proc_version(proc_version.read_text())
    except OSError:
        return DriverFacts(None, None, (), source=f"no driver ({failed}; no {proc_version})")
    return DriverFacts(version, None, (), source=f"{proc_version} ({failed})")
