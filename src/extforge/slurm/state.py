"""What became of each variant's job: the per-build state file, squeue/sacct, exit files.

sacct only knows finished jobs where Slurm accounting storage is configured, and squeue
forgets a job minutes after it ends (MinJobAge). So a job writes its exit status into a
file, and the state is read in order: channel (published?), squeue, exit file, sacct.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..channel_ref import listing as listing_of
from ..channel_ref import local_folder
from ..errors import ExtforgeError
from ..safe_files import make_dirs, write_atomic
from ..shared_read import Refused, read_json, read_text, shown, text
from .script import JobFiles

STATE_NAME = "state.json"
SCHEMA = 1
STATE_LIMIT = 16 << 20
MAX_JOBS = 100_000
# A variant's id names its job's files (JobFiles.under): `<name>-<version>-<build>`, no folder.
VARIANT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]{0,254}")
_JOB_ID = re.compile(r"[0-9]{1,20}")  # sbatch --parsable's
_OUTPUT = re.compile(r"[a-z0-9_]+(-[a-z0-9_]+)?/[A-Za-z0-9_][A-Za-z0-9_.+!-]{0,254}")
_ANY = re.compile(r"[^\x00-\x1f\x7f]{0,4096}", re.S)

# Slurm job states that mean the job may still do something.
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}


@dataclass
class JobRecord:
    variant_id: str
    job_id: str
    values: dict[str, str]
    outputs: list[str]  # "<subdir>/<name>-<version>-<build>" stems in the channel
    log: str
    exit_file: str
    script: str
    submitted: str  # ISO time


@dataclass
class BuildState:
    """`<output-dir>/slurm/state.json`: what was submitted for a recipe, so a re-run adds only what is missing."""

    recipe: str
    channel: str
    jobs: dict[str, JobRecord] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "recipe": self.recipe, "channel": self.channel, "jobs": {k: asdict(v) for k, v in self.jobs.items()}}

    @classmethod
    def from_json(cls, data: object, root: Path) -> BuildState:
        """The state file's values, typed (shared_read): an output folder may be one others write.
        A job's script, log and exit file are where its variant's are below `root`
        (JobFiles.under), whatever paths the file names: status reads and shows them."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"unknown state schema {shown(data.get('schema') if isinstance(data, dict) else data)}")
        jobs = data["jobs"]
        if not isinstance(jobs, dict) or len(jobs) > MAX_JOBS:
            raise ValueError(f"its jobs are no mapping of at most {MAX_JOBS} variants")
        return cls(text(data["recipe"], "recipe", _ANY), text(data["channel"], "channel", _ANY),
                   {text(k, "a variant", VARIANT_ID): _job(k, v, root) for k, v in jobs.items()})


def _job(variant_id: str, v: object, root: Path) -> JobRecord:
    if not isinstance(v, dict) or not isinstance(v.get("values"), dict) or not isinstance(v.get("outputs"), list):
        raise ValueError(f"the job of {shown(variant_id)} is no record of its values and outputs")
    files = JobFiles.under(root, variant_id)
    return JobRecord(variant_id, text(v["job_id"], "a job id", _JOB_ID),
                     {text(k, "a variant key", _ANY): text(val, "a variant value", _ANY) for k, val in v["values"].items()},
                     [text(o, "an output", _OUTPUT) for o in v["outputs"]],
                     str(files.log), str(files.exit_file), str(files.script), text(v["submitted"], "submitted", _ANY))


def state_path(root: Path) -> Path:
    return root / STATE_NAME


def load_state(root: Path) -> BuildState | None:
    path = state_path(root)
    if not os.path.lexists(path):
        return None
    try:
        return read_json(path, lambda data: BuildState.from_json(data, root.absolute()), limit=STATE_LIMIT, beneath=root)
    except Refused as exc:
        raise ExtforgeError(
            f"the Slurm state file {path} is unreadable",
            exc.reason,
            "move it away: the next `extforge build --slurm` re-submits what is not in the channel",
        ) from None


def save_state(root: Path, state: BuildState) -> None:
    path = state_path(root)
    make_dirs(path.parent)
    write_atomic(path, (json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n").encode())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- Slurm query output (pure parsers) -------------------------------------------------

SQUEUE_FORMAT = "%i|%T|%r|%N"


@dataclass(frozen=True)
class QueueEntry:
    job_id: str
    state: str  # Slurm's state name, e.g. RUNNING, FAILED, OUT_OF_MEMORY
    reason: str
    nodes: str
    exit_code: str | None = None  # "rc:signal", from sacct only


def parse_squeue(text: str) -> dict[str, QueueEntry]:
    """`squeue -h -o '%i|%T|%r|%N' --states=all` → entries by job id."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 4 and parts[0]:
            out[parts[0]] = QueueEntry(parts[0], parts[1], parts[2], parts[3])
    return out


def parse_sacct(text: str) -> dict[str, QueueEntry]:
    """`sacct -n -P -X -o JobID,State,ExitCode,NodeList` → entries by job id.

    sacct writes states like "CANCELLED by 0"; only the first word is the state.
    """
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 4 and parts[0]:
            state = parts[1].split()[0] if parts[1] else ""
            out[parts[0]] = QueueEntry(parts[0], state, "", parts[3], parts[2])
    return out


def parse_sbatch_parsable(text: str) -> str:
    """`sbatch --parsable` prints "<jobid>" or "<jobid>;<cluster>"."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = line.split(";")[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"unexpected sbatch output {text!r}")
    return job_id


def run_slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise ExtforgeError(
            f"{argv[0]} not found",
            "Slurm's client commands are not on PATH on this host",
            "run on a login node of the cluster, or load its Slurm module",
        ) from exc


def query_squeue(job_ids: list[str]) -> dict[str, QueueEntry]:
    if not job_ids:
        return {}
    proc = run_slurm(["squeue", "-h", "--states=all", "-o", SQUEUE_FORMAT, f"--jobs={','.join(job_ids)}"])
    if proc.returncode != 0:
        # squeue refuses a list of only forgotten jobs with "Invalid job id specified".
        if "Invalid job id" in proc.stderr:
            return {}
        raise ExtforgeError("squeue failed", proc.stderr.strip(), "check that slurmctld is reachable (`sinfo`)")
    return parse_squeue(proc.stdout)


def query_sacct(job_ids: list[str]) -> dict[str, QueueEntry]:
    """Finished jobs from accounting; empty where the cluster keeps none."""
    if not job_ids:
        return {}
    proc = run_slurm(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,NodeList", f"--jobs={','.join(job_ids)}"])
    return parse_sacct(proc.stdout) if proc.returncode == 0 else {}


# --- per-variant verdict (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class VariantStatus:
    variant_id: str
    state: str  # published | pending | running | failed | built | lost | not-submitted
    job_id: str | None
    detail: str
    log: str | None

    @property
    def done(self) -> bool:
        return self.state in {"published", "failed", "lost", "built", "not-submitted"}


def read_exit_code(path: Path) -> int | None:
    """What the job's exit trap wrote (a FIFO or link planted in its place is none)."""
    try:
        return int(read_text(path, limit=64, beneath=path.parents[1]).strip())
    except (OSError, ValueError, Refused):
        return None


def classify(
    record: JobRecord | None,
    variant_id: str,
    published: bool,
    queue: QueueEntry | None,
    exit_code: int | None,
    accounting: QueueEntry | None,
) -> VariantStatus:
    """One variant's state from everything known about it, most authoritative first."""
    job = record.job_id if record else None
    log = record.log if record else None
    if published:
        return VariantStatus(variant_id, "published", job, "in the channel", log)
    if record is None:
        return VariantStatus(variant_id, "not-submitted", None, "no job submitted yet", None)
    if queue and queue.state in ACTIVE:
        state = "pending" if queue.state == "PENDING" else "running"
        where = f"on {queue.nodes}" if queue.nodes and state == "running" else f"reason {queue.reason}"
        return VariantStatus(variant_id, state, job, f"{queue.state} {where}".strip(), log)
    if exit_code is not None:
        if exit_code == 0:
            return VariantStatus(variant_id, "built", job, "job succeeded but the package is not in this channel", log)
        return VariantStatus(variant_id, "failed", job, f"exit code {exit_code}", log)
    ended = queue or accounting
    if ended:
        # The job ended without its exit trap running: Slurm killed it.
        return VariantStatus(variant_id, "failed", job, f"Slurm state {ended.state}" + (f" ({ended.reason})" if ended.reason and ended.reason != "None" else ""), log)
    return VariantStatus(variant_id, "lost", job, "job is gone from Slurm and left no exit status (cancelled, or killed before it started)", log)


def published_in(listing: set[str], outputs: list[str]) -> bool:
    """Whether the channel's index (`channel_ref.listing`) lists every output ("linux-64/<name>-<version>-<build>").

    The index, not the file: publish copies the package in before it re-indexes, and a user
    told "published" installs next."""
    return all({f"{o}.conda", f"{o}.tar.bz2"} & listing for o in outputs)


def collect(state: BuildState, variant_ids: list[str] | None = None) -> list[VariantStatus]:
    """Ask Slurm (once per command, for all jobs) and the filesystem about every variant."""
    ids = variant_ids if variant_ids is not None else list(state.jobs)
    channel = local_folder(state.channel)
    records = {i: state.jobs.get(i) for i in ids}
    listing = listing_of(channel, {o.rpartition("/")[0] for r in records.values() if r for o in r.outputs})
    published = {vid: r is not None and published_in(listing, r.outputs) for vid, r in records.items()}
    pending = [r for vid, r in records.items() if r and not published[vid]]
    queue = query_squeue([r.job_id for r in pending]) if pending else {}
    no_exit = [r.job_id for r in pending if r.job_id not in queue and read_exit_code(Path(r.exit_file)) is None]
    accounting = query_sacct(no_exit) if no_exit else {}
    out = []
    for vid, r in records.items():
        out.append(
            classify(
                r,
                vid,
                published[vid],
                queue.get(r.job_id) if r else None,
                read_exit_code(Path(r.exit_file)) if r else None,
                accounting.get(r.job_id) if r else None,
            )
        )
    return out
