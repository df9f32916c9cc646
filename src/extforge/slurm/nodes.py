"""The nodes of a partition, as sinfo reports them."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ExtforgeError
from ..machine import Machine
from .state import run_slurm

SINFO_FORMAT = "%N|%c|%m|%T"
# Node states in which srun can start a task now or soon.
USABLE = {"idle", "mixed", "allocated", "completing"}


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    state: str  # sinfo's long state, e.g. idle, mixed, drained, down*

    @property
    def usable(self) -> bool:
        return self.state.rstrip("*~#!%$@^-+") in USABLE and not self.state.endswith("*")


def parse_sinfo(text: str) -> list[Node]:
    """`sinfo -h -N -o '%N|%c|%m|%T'` → one Node per line (a node in two partitions appears once)."""
    seen: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            seen.setdefault(parts[0], Node(parts[0], int(parts[1]), int(parts[2]), parts[3]))
    return list(seen.values())


def partition_nodes(partition: str | None) -> list[Node]:
    argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT] + ([f"--partition={partition}"] if partition else [])
    proc = run_slurm(argv)
    if proc.returncode != 0:
        raise ExtforgeError("sinfo failed", proc.stderr.strip(), "check that slurmctld is reachable and the partition exists")
    nodes = parse_sinfo(proc.stdout)
    if not nodes:
        raise ExtforgeError(
            f"partition {partition or '(default)'} has no nodes",
            "sinfo listed none",
            "name an existing partition with --partition (see `sinfo -s`)",
        )
    return nodes


def build_node_type(nodes: list[Node]) -> Machine:
    """The node a job may land on, planned for the smallest one so no variant outgrows its node."""
    cores = min(n.cpus for n in nodes)
    memory = min(n.memory_mb for n in nodes) * 1024**2
    return Machine(cores=cores, memory_bytes=memory, glibc=None, cores_source="sinfo", memory_source="sinfo RealMemory")
