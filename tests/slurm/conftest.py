"""A real single-host Slurm (munged + slurmctld + slurmd) for the tests in this folder.

Installs Debian's slurm-wlm and munge when missing and we are root, writes its own munge key
and slurm.conf into a temp dir, starts the daemons on free loopback ports and points
SLURM_CONF at it. Where that cannot work, the tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from extforge.machine import detect

DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    root: Path
    partition: str
    node: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}


def _ensure_installed() -> str | None:
    """None when the daemons are there (installing them if we may), else why not."""
    if all(shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") for d in DAEMONS) and shutil.which("sbatch"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed and we are not root on a Debian-like host (apt-get install slurm-wlm munge)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            return f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-500:]}"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int, memory_mb: int, cpus: int = 2) -> str:
    return f"""\
ClusterName=extforgetest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
MailProg=/bin/true
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _wait_idle(env: dict[str, str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env)
        if proc.returncode == 0 and proc.stdout.strip() == "idle":
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    why = _ensure_installed()
    if why:
        pytest.skip(f"no local Slurm: {why}")
    root = tmp_path_factory.mktemp("slurm")
    # munged refuses sockets and keys in group/world-writable directories.
    root.chmod(0o711)
    for d in ("state", "spool", "log"):
        (root / d).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ctld_port, slurmd_port = _free_ports(2)
    # Leave the host some memory: RealMemory above what slurmd sees drains the node.
    memory_mb = int(detect().memory_bytes / 1024**2 * 0.9)
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, ctld_port, slurmd_port, memory_mb))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    sbin = lambda name: shutil.which(name, path="/usr/sbin:/sbin:" + os.environ.get("PATH", ""))  # noqa: E731
    commands = [
        [sbin("munged"), "-F", "-f", f"--key-file={key}", f"--socket={root}/munge.sock",
         f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed", f"--log-file={root}/log/munged.log"],
        [sbin("slurmctld"), "-D", "-i"],
        [sbin("slurmd"), "-D", "-N", "localhost"],
    ]
    procs: list[subprocess.Popen] = []
    try:
        for argv in commands:
            log = open(root / "log" / f"{Path(argv[0]).name}.out", "w")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(1.0)
            if procs[-1].poll() is not None:
                break
        if any(p.poll() is not None for p in procs) or not _wait_idle(env, 60):
            tails = "\n".join(f"{f.name}: {f.read_text()[-400:]}" for f in sorted((root / "log").glob("*")))
            pytest.skip(f"local Slurm did not reach an idle node within 60 s:\n{tails}")
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(conf)
        yield SlurmCluster(conf=conf, root=root, partition="debug", node="localhost")
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
