"""Facts about the machine we run on: cores and memory as limited by cgroups, glibc.

Schedulers (Slurm, Kubernetes, CI) confine jobs with cgroups while /proc/meminfo and
os.cpu_count() still report the whole host; planning a build from those numbers is how
nvcc jobs get OOM-killed. Pure parsers are separate from the file reads so they can be
tested with recorded cgroup contents.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ExtforgeError

GIB = 1024**3


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_bytes: int
    glibc: str | None
    cores_source: str  # "affinity", "cgroup cpu.max", ...
    memory_source: str  # "meminfo", "cgroup v2 memory.max", ...

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max: '<quota> <period>' or 'max <period>' → CPUs, or None for no limit."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = int(parts[0])
    period = int(parts[1]) if len(parts) > 1 else 100_000
    return quota / period


def parse_memory_limit(text: str) -> int | None:
    """cgroup v2 memory.max or v1 memory.limit_in_bytes → bytes, or None for no limit."""
    text = text.strip()
    if not text or text == "max":
        return None
    value = int(text)
    # cgroup v1 reports "no limit" as a huge page-aligned number near 2**63.
    return None if value >= 2**60 else value


def parse_meminfo_total(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("MemTotal not found in /proc/meminfo")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_dir(root: Path) -> Path:
    """The cgroup v2 directory of this process (unified hierarchy), else the root."""
    text = _read(Path("/proc/self/cgroup")) or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip().lstrip("/")
            candidate = root / rel
            if candidate.is_dir():
                return candidate
    return root


def detect(cgroup_root: Path = Path("/sys/fs/cgroup")) -> Machine:
    cores = len(os.sched_getaffinity(0))
    cores_source = "affinity"
    memory = parse_meminfo_total(_read(Path("/proc/meminfo")) or "MemTotal: 0 kB")
    memory_source = "meminfo"

    cg = _cgroup_dir(cgroup_root)
    # Limits can sit on any ancestor cgroup; the tightest one applies.
    for d in [cg, *cg.parents]:
        if not str(d).startswith(str(cgroup_root)):
            break
        quota = parse_cpu_max(_read(d / "cpu.max") or "")
        if quota is not None and int(quota) < cores:
            cores, cores_source = max(1, int(quota)), f"cgroup cpu.max ({d})"
        limit = parse_memory_limit(_read(d / "memory.max") or "")
        if limit is not None and limit < memory:
            memory, memory_source = limit, f"cgroup v2 memory.max ({d})"
    v1 = parse_memory_limit(_read(cgroup_root / "memory" / "memory.limit_in_bytes") or "")
    if v1 is not None and v1 < memory:
        memory, memory_source = v1, "cgroup v1 memory.limit_in_bytes"

    libc, version = platform.libc_ver()
    return Machine(
        cores=cores,
        memory_bytes=memory,
        glibc=version if libc == "glibc" and version else None,
        cores_source=cores_source,
        memory_source=memory_source,
    )


# A bare number is megabytes, as in Slurm's --mem and sinfo's MEMORY column.
_UNITS = {"": 1024**2, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_memory(text: str) -> int:
    """'128G', '64GiB', '512M', '2T' or a bare number of megabytes → bytes (powers of 1024, like Slurm)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ExtforgeError(f"cannot read memory size '{text}'", fix="write it like 128G, 64GiB or 512M (a bare number is megabytes, as in Slurm)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
