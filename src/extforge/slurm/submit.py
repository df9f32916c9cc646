"""`extforge build --slurm`: one sbatch job per variant that is not yet built or in flight."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import paths
from ..building.build_options import BuildOptions
from ..channel_ref import channel_url
from ..doctor.explain import explain_text
from ..engine import find_recipe
from ..errors import ExtforgeError
from ..machine import Machine, parse_memory
from ..planning import cost_store
from ..planning.plan import plan_build, slurm_request
from ..recipes import trust
from ..recipes.variants import resolve
from ..safe_files import make_dirs, make_private_dir, remove, write_atomic
from ..shared_read import Refused, read_text
from .config import SlurmConfig
from .matrix import Variant, expand
from .nodes import build_node_type, partition_nodes
from .script import BUILD_LOG_MARK, ERROR_MARK, BuildJob, JobFiles, render_build_script, render_parts_script
from .state import (
    BuildState,
    JobRecord,
    VariantStatus,
    collect,
    load_state,
    now_iso,
    parse_sbatch_parsable,
    run_slurm,
    save_state,
)

LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class BuildRequest:
    options: BuildOptions  # what each job's `extforge build` builds, exactly as a local build would
    publish_to: str
    config: SlurmConfig
    parts: int = 1  # a split build: a job array of this many parts before each variant's link job
    wheels: Path | None = None  # the wheel index each job also publishes its package's wheel to (absolute)

    @property
    def output_dir(self) -> Path:
        return self.options.output_dir

    @property
    def root(self) -> Path:
        """Scripts, logs, exit files and the state file of this build's jobs."""
        return self.output_dir / "slurm"


@dataclass
class SubmitResult:
    submitted: list[JobRecord] = field(default_factory=list)
    skipped: list[VariantStatus] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)  # variant id → script text


def node_type(config: SlurmConfig) -> Machine:
    """The build node to plan for: configured, else the partition's smallest node."""

    if config.node_cores and config.node_memory:
        return Machine(config.node_cores, parse_memory(config.node_memory), None, "slurm config", "slurm config")
    try:
        found = build_node_type(partition_nodes(config.partition))
    except ExtforgeError as exc:
        raise ExtforgeError(
            "cannot tell how big a build node is",
            f"{exc.what}: {exc.why}",
            "pass --node-cores and --node-memory (or set node_cores/node_memory in slurm.toml)",
        ) from exc
    return Machine(
        config.node_cores or found.cores,
        parse_memory(config.node_memory) if config.node_memory else found.memory_bytes,
        None,
        found.cores_source,
        found.memory_source,
    )


def profile_for(variant: Variant, configured: str | None) -> str:
    """The planner profile: configured, else the package's name (what the cost store learned
    from its earlier builds, what the recipe's folder ships, or the planner's conservative estimate)."""
    return configured or variant.name


def planned_resources(machine: Machine, profile: str, archs: list[str] | None) -> tuple[str, ...]:
    """sbatch resource options for one variant, exactly as `extforge plan` computes them."""

    plan = plan_build(machine, profile, archs) if archs else plan_build(machine, profile)
    return tuple(slurm_request(plan).sbatch_args())


def extforge_argv(config: SlurmConfig) -> tuple[str, ...]:
    # The interpreter running us: on a cluster a venv on the shared filesystem every node sees.
    return tuple(shlex.split(config.extforge)) if config.extforge else (sys.executable, "-m", "extforge.job_entry")


def make_job(req: BuildRequest, variant: Variant, channels: list[str], machine: Machine) -> BuildJob:
    # Named in the job too, so the planner inside the job's cgroup plans the same build.
    profile = profile_for(variant, req.config.profile)
    return BuildJob(
        variant=variant,
        recipe=req.options.recipe.resolve(),
        channels=tuple(channels),
        publish_to=req.publish_to,
        variant_files=tuple(p.resolve() for p in req.options.variant_configs),
        files=JobFiles.under(req.root.resolve(), variant.id),
        resources=planned_resources(machine, profile, variant.archs()),
        extforge=extforge_argv(req.config),
        profile=profile,
        build_flags=(() if req.options.test else ("--no-test",)) + (() if req.options.audit else ("--no-audit",))
        + (("--wheel",) if req.options.wheel else ())
        + (("--manylinux", "{}_{}".format(*req.options.manylinux)) if req.options.manylinux else ()),
        publish_flags=() if req.options.audit else ("--no-audit",),
        wheel_publish=(("--wheels", str(req.wheels)) if req.wheels else ())
        + (("--manylinux", "{}_{}".format(*req.options.manylinux)) if req.wheels and req.options.manylinux else ()),
        # Source and compile caches live under the cache root: one shared root for all jobs.
        env=(("EXTFORGE_CACHE", req.config.shared_cache or str(paths.cache_root())),),
        parts=req.parts,
    )


def own_job_folders(root: Path, files: JobFiles) -> None:
    """The folders a job writes into by name (its script, Slurm's --output log, the exit trap's
    redirect, the build's output folder), each this user's and writable by nobody else, in a
    folder nobody else can rename them out of: a link another user planted there, or a folder of
    theirs in place of one, would have the job write as this user wherever it leads."""
    make_dirs(root.parent)
    if who := paths.who_else_may_write(root.parent.stat(), sticky_folder_ok=True):
        raise ExtforgeError(
            f"cannot submit jobs from {root.parent}: others may write it: {who}",
            f"each job writes its log, exit status and packages by name below {root}; whoever can write "
            f"{root.parent} can put a folder of their own there, with links to your files",
            "pass an --output-dir only you can write (the channel and wheel index the jobs publish to may stay shared)")
    make_private_dir(root, readable=True)
    for d in (files.script.parent, files.log.parent, files.exit_file.parent, files.output_dir.parent, files.output_dir):
        make_private_dir(d, beneath=root, readable=True)


def sbatch(script: Path) -> str:
    proc = run_slurm(["sbatch", "--parsable", str(script)])
    if proc.returncode != 0:
        raise ExtforgeError(f"sbatch refused {script.name}", proc.stderr.strip(), "fix the partition/account/options in slurm.toml or the flags")
    try:
        return parse_sbatch_parsable(proc.stdout)
    except ValueError as exc:
        raise ExtforgeError("sbatch gave no job id", str(exc), "run the script by hand with sbatch to see why") from exc


def submit_matrix(req: BuildRequest, *, dry_run: bool = False) -> SubmitResult:
    """Submit every variant that is neither published, in flight nor already built."""

    # Refused here too, not only by the job's build, before anything is queued.
    recipe = trust.checked(find_recipe(req.options.recipe)).resolve()
    channels = [channel_url(c) for c in req.options.channels]
    # The same variant files `extforge build` will read on the node, so both render alike.
    variants = expand(recipe, resolve(recipe, channels, req.options.variant_configs, req.options.variants))
    state = load_state(req.root) or BuildState(str(recipe), req.publish_to)
    state.channel = req.publish_to
    known = {s.variant_id: s for s in collect(state, [v.id for v in variants if v.id in state.jobs])}
    result = SubmitResult()
    todo = [v for v in variants if v.id not in known or known[v.id].state in {"failed", "lost"}]
    result.skipped = [s for s in known.values() if s.variant_id not in {v.id for v in todo}]
    if not todo:
        return result
    machine = node_type(req.config)
    for v in todo:
        # Planned as `extforge build` plans it: from the costs the recipe's folder ships too.
        with cost_store.recipe_costs(recipe.parent):
            job = make_job(req, v, channels, machine)
        parts_text = render_parts_script(job, req.config) if job.parts > 1 else None
        if parts_text:
            result.scripts[f"{v.id}:parts"] = parts_text
        result.scripts[v.id] = render_build_script(replace(job, after_job="PARTS_JOB_ID") if parts_text else job, req.config)
        if dry_run:
            continue
        own_job_folders(req.root.resolve(), job.files)
        if parts_text:
            parts_script = job.files.script.with_name(f"{v.id}.parts.sbatch")
            write_atomic(parts_script, parts_text.encode())
            job = replace(job, after_job=sbatch(parts_script))
        text = render_build_script(job, req.config)
        write_atomic(job.files.script, text.encode())
        remove(job.files.exit_file)
        job_id = sbatch(job.files.script)
        record = JobRecord(v.id, job_id, dict(v.values), list(v.outputs), str(job.files.log), str(job.files.exit_file), str(job.files.script), now_iso())
        state.jobs[v.id] = record
        # Saved after every submission: an interrupted run must not lose track of live jobs.
        save_state(req.root, state)
        result.submitted.append(record)
    return result


def wait_for(root: Path, ids: list[str], timeout: float, poll: float = 2.0) -> list[VariantStatus]:
    """Poll until every variant is done (published, failed, ...) or the timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        state = load_state(root)
        statuses = collect(state, ids) if state else []
        if all(s.done for s in statuses) or time.monotonic() >= deadline:
            return statuses
        time.sleep(poll)


def read_log(path: str | None, limit: int = 256 * 1024) -> str:
    """The end of a job log (the part that explains a failure), '' when missing. It lies below
    the build's slurm/ folder (JobFiles.under), which others may write: a link or FIFO planted
    there is not followed or waited on, and what was refused is said instead."""
    if not path:
        return ""
    log = Path(path)
    try:
        return read_text(log, limit=limit, beneath=log.parents[1], tail=True)
    except Refused as exc:
        return f"extforge: the job log was not read: {exc.reason}"
    except OSError:
        return ""


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def split_job_log(text: str) -> tuple[str, str]:
    """A job log → (the build's own output, extforge's error paragraph); ('', '') parts when unmarked.

    A failed build's error paragraph (paths, rich's line wrapping) can fill a whole tail;
    the lines that show the cause sit in the build log copied above it.
    """
    head, mark, rest = text.partition(BUILD_LOG_MARK)
    if not mark:
        return text, ""
    build, mark, error = rest.partition(ERROR_MARK)
    build = build.split("\n", 1)[1] if "\n" in build else ""
    error = error.split("\n", 1)[1] if "\n" in error else ""
    return build, error.strip()


def diagnose(log_text: str) -> dict[str, Any]:
    """`extforge explain`'s verdict on a failed job's log."""
    return explain_text(log_text).to_json()
