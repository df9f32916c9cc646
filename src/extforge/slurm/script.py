"""sbatch scripts, generated purely from a variant, the planner's request and paths.

A job builds one variant with `extforge build`, publishes what it built, and records its
exit status in a file next to its log: clusters without Slurm accounting (no sacct) keep
no record of a finished job, and `extforge status` must still tell success from failure.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from .config import SlurmConfig
from .matrix import Variant

# Lines the job writes into its log so a reader can split it into the build's own output
# and extforge's error paragraph.
BUILD_LOG_MARK = "extforge: last lines of the build log"
ERROR_MARK = "extforge: build failed with exit code"


@dataclass(frozen=True)
class JobFiles:
    """Where one variant's job keeps its script, log, exit status and build output."""

    script: Path
    log: Path
    exit_file: Path
    output_dir: Path

    @classmethod
    def under(cls, root: Path, variant_id: str) -> JobFiles:
        return cls(
            script=root / "scripts" / f"{variant_id}.sbatch",
            log=root / "logs" / f"{variant_id}.log",
            exit_file=root / "exit" / f"{variant_id}.exit",
            output_dir=root / "out" / variant_id,
        )


@dataclass(frozen=True)
class BuildJob:
    variant: Variant
    recipe: Path
    channels: tuple[str, ...]  # what the build solves against
    publish_to: str  # the channel the package goes to when it built and passed its audit
    variant_files: tuple[Path, ...]  # given by the user; build finds the recipe's and channels' own
    files: JobFiles
    resources: tuple[str, ...]  # sbatch options from the planner, e.g. --cpus-per-task=16
    extforge: tuple[str, ...]  # argv prefix that runs extforge on a node
    profile: str | None = None  # planner profile, passed on to `extforge build`
    build_flags: tuple[str, ...] = ()  # e.g. --no-test, passed on to `extforge build`
    publish_flags: tuple[str, ...] = ()  # e.g. --no-audit, passed on to `extforge publish`
    wheel_publish: tuple[str, ...] = ()  # --wheels DIR [--manylinux 2_N]: its wheel is published too, first
    env: tuple[tuple[str, str], ...] = ()  # exported before the build (shared caches)
    # A build in parts (building/parts.py): this many part jobs (a job array) compile into the shared
    # compile cache first, and this job is their link job, started when the array has ended.
    parts: int = 1
    after_job: str | None = None  # the job (array) this job waits for


def sbatch_options(job: BuildJob, config: SlurmConfig) -> list[str]:
    opts = [f"--job-name=extforge:{job.variant.id}", f"--output={job.files.log}", "--nodes=1", "--ntasks=1"]
    resources = list(job.resources)
    if config.time:
        resources = [r for r in resources if not r.startswith(("--time=", "-t"))] + [f"--time={config.time}"]
    opts += resources
    for flag, value in (("--partition", config.partition), ("--account", config.account), ("--qos", config.qos)):
        if value:
            opts.append(f"{flag}={value}")
    if job.after_job:
        # afterany: a part that failed or was preempted only leaves units for the link job to compile.
        opts.append(f"--dependency=afterany:{job.after_job}")
    opts += list(config.extra_args)
    return opts


def _cmd(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def build_argv(job: BuildJob, output_dir: str) -> list[str]:
    """The job's `extforge build` command, as a local build of the variant would run it."""
    build = [*job.extforge, "build", str(job.recipe), "--output-dir", output_dir]
    for channel in job.channels:
        build += ["--channel", channel]
    for f in job.variant_files:
        build += ["--variant-config", str(f)]
    build += job.variant.build_args
    if job.profile:
        build += ["--profile", job.profile]
    return build + list(job.build_flags)


def parts_dir(job: BuildJob) -> Path:
    return job.files.output_dir.parent / f"{job.variant.id}.parts"


def render_parts_script(job: BuildJob, config: SlurmConfig) -> str:
    """The job array of a build's parts: task I runs `extforge build --part I/N`; what it
    compiles goes to the shared compile cache, nothing is published (the link job does that)."""
    opts = [o for o in sbatch_options(job, config) if not o.startswith(("--job-name=", "--output="))]
    log = job.files.log.with_name(f"{job.variant.id}.part-%a.log")
    out = f"{parts_dir(job)}/$SLURM_ARRAY_TASK_ID"
    build = _cmd(build_argv(job, "@OUT@")).replace("@OUT@", f'"{out}"')
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=extforge:{job.variant.id}:parts",
        f"#SBATCH --output={log}",
        f"#SBATCH --array=1-{job.parts}",
        *(f"#SBATCH {o}" for o in opts),
        f"# extforge {__version__}: the {job.parts} parts of variant {job.variant.id} (a build in parts)",
        "set -euo pipefail",
        'echo "extforge: $(date -Is) part ${SLURM_ARRAY_TASK_ID}/' + str(job.parts) + ' (job ${SLURM_JOB_ID:-?}) on $(hostname)"',
        *(f"export {k}={shlex.quote(val)}" for k, val in job.env),
        *config.setup,
        f'{build} --part "${{SLURM_ARRAY_TASK_ID}}/{job.parts}"',
        "",
    ])


def render_build_script(job: BuildJob, config: SlurmConfig) -> str:
    v = job.variant
    q = shlex.quote
    build = build_argv(job, str(job.files.output_dir))
    if job.parts > 1:
        build += ["--link-parts", str(job.parts)]
    outputs = " ".join(q(f"{job.files.output_dir}/{o}") for o in v.outputs)
    publish = f"{_cmd([*job.extforge, 'publish'])} \"$pkg\""
    publish_args = f"{''.join(' --upstream ' + q(c) for c in job.channels)}{''.join(' ' + f for f in job.publish_flags)}"
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in sbatch_options(job, config)),
        f"# extforge {__version__}: variant {v.id}",
        *(f"#   {k} = {val}" for k, val in v.values),
        "set -euo pipefail",
        f"exit_file={q(str(job.files.exit_file))}",
        # Written last, atomically: its presence means the job ran to the end, its content how.
        "trap 'rc=$?; echo $rc > \"$exit_file.tmp\"; mv \"$exit_file.tmp\" \"$exit_file\"' EXIT",
        'echo "extforge: $(date -Is) job ${SLURM_JOB_ID:-?} on $(hostname)"',
        *(f"export {k}={q(val)}" for k, val in job.env),
        *config.setup,
        # A retried variant must publish what this attempt built, not a stale file.
        "rm -f " + " ".join(q(f"{job.files.output_dir}/{o}{ext}") for o in v.outputs for ext in (".conda", ".tar.bz2")),
        "rc=0",
        'build_err=$(mktemp)',
        _cmd(build) + ' 2> "$build_err" || rc=$?',
        # extforge build keeps rattler-build's output in its own log: bring the end of it
        # into the job log, then extforge's own error, so the log ends with the cause
        # (what `extforge status` shows and explain reads).
        'if [ "$rc" -ne 0 ]; then',
        f"  build_log=$(ls -t {q(str(job.files.output_dir))}/logs/*.log 2>/dev/null | head -n 1 || true)",
        f'  if [ -n "$build_log" ]; then echo "{BUILD_LOG_MARK} $build_log:"; tail -n 200 "$build_log"; fi',
        f'  echo "{ERROR_MARK} $rc:"',
        "fi",
        'cat "$build_err" >&2; rm -f "$build_err"',
        'if [ "$rc" -ne 0 ]; then exit "$rc"; fi',
        "published=0",
        f"for stem in {outputs}; do",
        '  for pkg in "$stem.conda" "$stem.tar.bz2"; do',
        '    if [ -f "$pkg" ]; then',
        # The wheel before the package: `extforge status` calls a variant published once the
        # channel lists it, so a wheel refused (a binary newer than --manylinux) fails the job first.
        *([f"      {publish} {_cmd(job.wheel_publish)}{publish_args}"] if job.wheel_publish else []),
        f"      {publish} --channel {q(job.publish_to)}{publish_args}",
        "      published=$((published + 1))",
        "    fi",
        "  done",
        "done",
        f'if [ "$published" -ne {len(v.outputs)} ]; then',
        f'  echo "extforge: expected {len(v.outputs)} package(s) in {job.files.output_dir}, found $published" >&2',
        "  exit 3",
        "fi",
        'echo "extforge: published $published package(s)"',
        "",
    ]
    return "\n".join(lines)
