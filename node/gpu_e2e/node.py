"""What the node is (GPUs, cores, memory) and the small conversions the phases share."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any


def gpu_facts() -> dict[str, str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return {"gpus": out or "none"}


def describe_node(gpus: str, cores: int, memory_gib: float) -> str:
    """The node as the side-by-side's records name it: "an H100 node (16 cores, 126 GiB, no network)",
    from nvidia-smi's csv lines."""
    names = [n.strip() for n in gpus.splitlines() if n.strip() and n != "none"]
    model = next((w for w in (names[0].split(",")[0].split() if names else []) if re.fullmatch(r"[A-Z]\d{2,3}\w*", w)), "GPU")
    count = {1: "", 2: "two ", 4: "four ", 8: "eight "}.get(len(names), f"{len(names)} ")
    head = (f"a node with {count}{model}s" if len(names) > 1
            else f"an {model} node" if model[0] in "AEHIOU" else f"a {model} node")
    return f"{head} ({cores} cores, {memory_gib:.0f} GiB, no network)"


def node_words() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return describe_node(gpu_facts()["gpus"], len(os.sched_getaffinity(0)), memory)


def halves(cores: dict[tuple[int, int], list[int]]) -> tuple[list[int], list[int]] | None:
    """CPUs by (socket, core) in two halves of whole cores (hyperthread siblings together), in
    socket order, so two builds pinned to them share no core; None on a single core."""
    ordered = [cores[key] for key in sorted(cores)]
    half = len(ordered) // 2
    if not half:
        return None
    return [c for core in ordered[:half] for c in core], [c for core in ordered[half:] for c in core]


def cpu_halves() -> tuple[list[int], list[int]] | None:
    """This process's CPUs in two halves (`halves`), read from sysfs."""
    def topology(cpu: int, name: str, default: int) -> int:
        try:
            return int(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}").read_text())
        except (OSError, ValueError):
            return default

    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        cores.setdefault((topology(cpu, "physical_package_id", 0), topology(cpu, "core_id", cpu)), []).append(cpu)
    return halves(cores)


def cpu_list(cpus: list[int]) -> str:
    """0,1,2,3,8 -> "0-3,8"."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def json_out(stdout: str) -> dict[str, Any]:
    """The JSON object a `--json` command printed, after whatever it printed before it."""
    found: dict[str, Any] = json.JSONDecoder().raw_decode(stdout, stdout.index("{"))[0]
    return found


def planned(stdout: str) -> dict[str, Any]:
    """The plan of `extforge plan --json`'s output."""
    plan: dict[str, Any] = json_out(stdout)["plan"]
    return plan


def sm_archs(archs: str) -> str:
    """FLASH_ATTN_CUDA_ARCHS ("80;90") as `extforge audit --archs` takes it ("sm_80,sm_90")."""
    return ",".join(f"sm_{a}" for a in archs.split(";"))


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
