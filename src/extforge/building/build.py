"""`extforge build`: build a v1 recipe with py-rattler-build against explicit channels.

Public API: build_recipe(...) -> list[BuiltPackage]; solve_failure(...) turns rattler-build's
"Failed to resolve dependencies" into what could not be found.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import compile_cache, engine, machine, paths, safe_files, shared_read
from ..archive import check_package
from ..audit import audit_package, local_archives
from ..cache import make_room
from ..channel_ref import SUBDIRS, all_records, channel_url, local_folder, package_names, records, repodata_mentions
from ..cuda_rule import missing_toolkit
from ..doctor.explain import explain_text
from ..engine import environment
from ..errors import ExtforgeError
from ..planning import cost_store, plan, unit_costs
from ..publishing.index import index_channel
from ..recipes import build_layer, scaffold, sources, trust
from ..recipes.variants import Matrix, recipe_yaml_error
from ..recipes.variants import archs as variant_archs
from ..recipes.variants import render as render_variants
from ..recipes.variants import resolve as resolve_variants
from ..stamp import run_requirements, stamp_package
from ..ui import log
from ..wheel.make import wheel_from_conda
from ..wheel.requirements import built_for_rows
from . import parts, stopping
from .build_options import BuildOptions


@dataclass
class BuiltPackage:
    path: Path
    name: str
    version: str
    build_string: str
    subdir: str
    audit_verdict: str | None = None  # None: not audited (--no-audit)
    # The CUDA toolkit that compiled it (the variant's cuda_compiler_version): the driver it needs.
    cuda_toolkit: str | None = None
    # This machine's compile speed against the planner's unit costs (None: no costs or no log).
    node_speed: float | None = None
    wheel: Path | None = None  # its wheel (--wheel), beside the channel in <output>/wheels
    wheel_refused: str | None = None  # why no wheel could be made of it (--wheel)

    def to_json(self) -> dict[str, str | float | None]:
        return {
            "path": str(self.path),
            "name": self.name,
            "version": self.version,
            "build_string": self.build_string,
            "subdir": self.subdir,
            "audit_verdict": self.audit_verdict,
            "node_speed": self.node_speed,
            "wheel": str(self.wheel) if self.wheel else None,
            "wheel_refused": self.wheel_refused,
        }


def needs_cuda_override(recipe_text: str, channels: Sequence[str]) -> bool:
    """Whether solving may meet `__cuda` (a CUDA pytorch depends on it; build hosts have no GPU)."""
    return "__cuda" in recipe_text or repodata_mentions(channels, '"__cuda')


def build_environment(
    recipe_text: str,
    channels: Sequence[str],
    variants: Mapping[str, list[str]],
    profile: str,
    part: parts.Part | None = None,
    units: int | None = None,
) -> dict[str, str]:
    """Variables the build needs: CONDA_OVERRIDE_CUDA, the planner's MAX_JOBS/NVCC_THREADS,
    longest-first unit order and units to split, a compile cache (which a build in parts must have).
    `units`: the translation units the sdist's setup.py names, for a recipe planned by the default estimate."""
    env: dict[str, str] = {}
    if "CONDA_OVERRIDE_CUDA" not in os.environ and needs_cuda_override(recipe_text, channels):
        env["CONDA_OVERRIDE_CUDA"] = (variants.get("cuda_compiler_version") or ["13.0"])[0]
    # Every recipe: a shipped profile, what the site's cost store learned, else a conservative estimate.
    env |= plan.plan_build(machine.detect(), profile, variant_archs(variants) or plan.DEFAULT_ARCHS,
                           version=cost_store.recipe_version(recipe_text), units=units, variant=variants).env()
    # No compile cache is no reason to fail a build, it only makes rebuilds slower; but the parts
    # of a build in parts hand their objects to the link job through it.
    try:
        env |= compile_cache.env()
    except ExtforgeError as exc:
        if part:
            raise ExtforgeError(f"{part.describe()} needs a compile cache: the parts' objects reach the link job "
                                "through it", exc.what, f"{exc.fix} (on every build node: all parts and the link job "
                                "use the compile cache of one EXTFORGE_CACHE on shared storage)") from exc
        if not isinstance(exc, compile_cache.NoCompileCache):
            log.warning("compiling without a compile cache: %s; %s", exc.what, exc.fix)
    return env


def part_environment(env: Mapping[str, str], part: parts.Part, profile: str, version: str | None,
                      variants: Mapping[str, list[str]], state_dir: Path) -> dict[str, str]:
    """The variables of one part of a build in parts, or of its link job: the compile cache is what
    carries the parts' objects to the link job, so there is none without it; one nvcc thread in
    every job, so parts and link job run the same compile commands (the cache's key)."""
    cache = env["EXTFORGE_COMPILER_LAUNCHER"]  # build_environment refused a build in parts without one
    # Private to this user (0700, made by them): what the launcher notes there is believed.
    output_dir = state_dir.parent.parent
    safe_files.make_dirs(state_dir.parent, beneath=output_dir)
    safe_files.make_private_dir(state_dir, beneath=output_dir)
    numbers = plan.numbers_for(profile, version)
    # The variant's own units, dealt longest first: a subset's parts are balanced on what it builds.
    costs = unit_costs.in_variant(numbers.costs.seconds(), numbers.costs.subsets, variants) if numbers.costs else {}
    assigned = parts.assignment(costs, part.parts)
    assignment_file = state_dir / parts.ASSIGNMENT_FILE
    safe_files.write_atomic(assignment_file, parts.assignment_text(assigned).encode(), mode=0o644)
    return {"NVCC_THREADS": "1",
            "EXTFORGE_COMPILER_LAUNCHER": parts.launcher(part, compile_cache.cache_tool(cache), state_dir,
                                                               assignment_file)}


def render_in(env: Mapping[str, str], recipe_file: Path, matrix: Matrix) -> list[Any]:
    """The recipe's variants rendered inside the build's variables: a recipe reads the planner's
    MAX_JOBS, NVCC_THREADS and unit order (and the compile cache) with `env.get` when it is
    rendered, so a render outside them bakes in the recipe's defaults (2 jobs, upstream order)."""
    with environment(env):
        return render_variants(recipe_file, matrix)


SPEC_LINE = re.compile(r"^\s*-\s+(\S.*)$")


def solve_context(log_lines: Sequence[str]) -> tuple[list[str], str | None]:
    """The specs and platform of the last solve rattler-build logged before failing."""
    specs: list[str] = []
    platform = None
    in_specs = False
    for raw in log_lines:
        line = raw.split(": ", 1)[1] if raw.startswith(("info: ", "warn: ", "error: ")) else raw
        stripped = line.strip()
        if stripped.startswith("Platform:"):
            platform, specs, in_specs = stripped[len("Platform:") :].strip(), [], False
        elif stripped == "Specs:":
            in_specs = True
        elif in_specs and (m := SPEC_LINE.match(line)):
            specs.append(m.group(1).strip())
        elif in_specs:
            in_specs = False
    return specs, platform


def missing_names(specs: Sequence[str], available: set[str]) -> list[str]:
    """Specs whose package name no channel has at all."""
    out = []
    for spec in specs:
        name = re.split(r"[\s=<>!~\[]", spec, maxsplit=1)[0]
        if name and not name.startswith("__") and name not in available:
            out.append(spec)
    return out


# How `extforge mirror` adds a package the build solve missed, by package name.
MIRROR_OPTIONS = {
    "python": "--python /path/to/pythonX.Y", "python_abi": "--python /path/to/pythonX.Y",
    "pytorch": "--torch torch==X.Y.Z", "cuda-version": "--cuda-home DIR", "cuda-nvcc_linux-64": "--cuda-home DIR",
    "gcc_linux-64": "CC=gcc-N CXX=g++-N before it", "gxx_linux-64": "CC=gcc-N CXX=g++-N before it",
}
SPEC_PARTS = re.compile(r"^(?P<name>[^\s=<>!~\[]+)\s*(?P<version>\S*)")


def channel_versions(specs: Sequence[str], channels: Sequence[str]) -> tuple[list[str], list[str]]:
    """For the versioned specs of a failed solve: those no package of that name in the channels
    matches by version (`python 3.12.*` against 3.11.7), and what the channels have of each name."""
    found: dict[str, set[str]] = {}
    for rec in all_records(channels):
        found.setdefault(rec["name"], set()).add(rec["version"])
    unmet, have = [], []
    for spec in specs:
        m = SPEC_PARTS.match(spec)
        if not m or not m["version"] or m["name"] not in found:
            continue
        versions = sorted(found[m["name"]])
        have.append(f"{m['name']} {', '.join(versions)}")
        glob = m["version"]
        if re.fullmatch(r"[\w.]+\.\*|[\w.]+", glob) and not any(
                v == glob.removesuffix(".*") or v.startswith(glob.removesuffix("*").rstrip(".") + ".") for v in versions):
            unmet.append(spec)
    return unmet, have


def solve_failure(log_lines: Sequence[str], channels: Sequence[str], log_file: Path) -> ExtforgeError:
    specs, platform = solve_context(log_lines)
    toolkits = {r["version"] for ch in channels for r in records(ch, "linux-64").values() if r["name"] == "cuda-nvcc"}
    toolkit = missing_toolkit(specs, toolkits)
    if toolkit:
        return toolkit
    missing = missing_names(specs, package_names(channels)) if specs else []
    unmet, have = channel_versions(specs, channels)
    if missing:
        what = f"the channels have no package for: {', '.join(missing)}"
    elif unmet:
        what = f"the channels have no package matching {', '.join(unmet)} (a variant the channels cannot build)"
    elif specs:
        what = f"no combination of packages in the channels satisfies: {', '.join(specs)}"
    else:
        what = "rattler-build could not resolve the build dependencies"
    why = f"solving for {platform or 'the target platform'} against {', '.join(channels)}"
    if have:
        why += f"; the channels have {'; '.join(have)}"
    names = list(dict.fromkeys(m["name"] for s in (missing or unmet) if (m := SPEC_PARTS.match(s))))
    how = "; ".join(f"{n}: {MIRROR_OPTIONS.get(n, f'--extra {n}')}" for n in names) or (
        "a python: --python PATH; a torch: --torch torch==X.Y.Z; a CUDA toolkit: --cuda-home DIR; another package: --extra NAME")
    folder = next(filter(None, map(local_folder, channels)), None)
    return ExtforgeError(
        what,
        why,
        f"add what is missing to the channel with `extforge mirror --channel {shlex.quote(str(folder or 'DIR'))}` "
        f"({how}), add the channel "
        f"that has it with --channel, or pick a variant the channels provide (--variant KEY=VALUE); log: {log_file}",
    )


def rattler_test_envs(work_root: Path) -> list[Path]:
    """The environments rattler-build creates to test a package (`<its output>/test/test_<name>*`)."""
    return sorted((work_root / "test").glob("test_*"))


BROKEN_DIR = "broken"


def set_aside_broken(work_root: Path, output_dir: Path) -> None:
    """The packages whose tests failed (rattler-build moves them to its output's broken/) into the
    output folder's broken/, beside its channel, never in it."""
    for package in (work_root / BROKEN_DIR).glob("*.conda"):
        place(package, output_dir / BROKEN_DIR, output_dir)


# Below this much free space a failed build is a full disk first: rattler-build says only
# "Failed to resolve dependencies" when it cannot unpack a package (a torch env is ~5 GB).
LOW_DISK_BYTES = 2 * 2**30


def low_disk(dirs: Sequence[Path]) -> str | None:
    """A 'No space left on device' line for the first of `dirs` whose disk is nearly full."""
    for d in dirs:
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(d).free
            if free < LOW_DISK_BYTES:
                return f"No space left on device: {free / 2**30:.1f} GiB free on the disk of {d}"
    return None


def failed_solve(exc: BaseException) -> bool:
    return "resolve dependencies" in str(exc) or "Failed to solve" in str(exc)


def untestable(exc: BaseException, urls: Sequence[str], recipe_file: Path, log_file: Path,
               work_root: Path, output_dir: Path) -> ExtforgeError | None:
    """A package built, then refused by its tests because their env cannot be solved: a run
    requirement no channel has (mamba-ssm without causal-conv1d). rattler-build says only "Test
    failed" and moves the package to broken/ of its output (the build's work root, whence
    set_aside_broken moves it to OUTPUT/broken/); its index names the requirements."""
    if "Test failed" not in engine.engine_message(exc):
        return None
    broken = sorted((work_root / BROKEN_DIR).glob("*.conda"), key=lambda f: f.stat().st_mtime)
    if not broken:
        return None
    try:
        meta = check_package(broken[-1])
    except ExtforgeError:
        return None
    depends = [str(d) for d in meta.index.get("depends", [])]
    missing = missing_names(depends, package_names(urls, meta.subdir or "linux-64"))
    unmet, have = channel_versions(depends, urls)
    if not (missing or unmet):
        return None
    absent = ", ".join(missing or unmet)
    return ExtforgeError(
        f"building {recipe_file.parent.name} failed: its tests could not start: the channels have no package for {absent}",
        f"rattler-build tests a package in a new env of it and its run requirements ({', '.join(depends)}), solved "
        f"against {', '.join(urls)}" + (f" (they have {'; '.join(have)})" if have else "")
        + f"; it says only \"Test failed\". The package itself built: {output_dir / BROKEN_DIR / broken[-1].name} "
        "(not in any channel)",
        f"build and publish {absent} first and pass its channel with -c (one built into this output folder: "
        f"-c {shlex.quote(str(output_dir))}; a PyPI package: `extforge mirror --extra NAME`), "
        f"or build with --no-test (the audit still runs); log: {log_file}",
    )


def build_failure(exc: BaseException, lines: Sequence[str], urls: Sequence[str], recipe_file: Path, log_file: Path,
                  work_dirs: Sequence[Path], folders: tuple[Path, Path] | None = None) -> ExtforgeError:
    """What a failed build says; `folders`: the build's work root and its output folder."""
    if parse_error := recipe_yaml_error(exc, recipe_file):
        return parse_error
    if folders is not None and (cannot_test := untestable(exc, urls, recipe_file, log_file, *folders)):
        return cannot_test
    full = low_disk([log_file.parent, *(folders or ())[:1], paths.rattler_cache_dir(create=False)])
    if full:
        lines = [*lines, full]
    elif failed_solve(exc):
        return solve_failure(lines, urls, log_file)
    kept = f"; its work folder (sources, build tree, host env) is kept at {', '.join(map(str, work_dirs))}"
    where = f"build log: {log_file}" + (kept + " (delete it when done)" if work_dirs else "")
    # The build's own log names the cause more often than rattler-build's "Script failed".
    found = explain_text("\n".join(lines)).diagnoses
    if found:
        d = found[0]
        return ExtforgeError(
            f"building {recipe_file.parent.name} failed: {d.title}",
            f"{d.cause} (seen in the log: {d.evidence.strip()[:300]})",
            f"{d.fix.rstrip('.')}; {where}",
        )
    tail = [line for line in lines if line.startswith("error:")][-5:]
    return ExtforgeError(
        f"building {recipe_file.parent.name} failed: {engine.engine_message(exc)}{engine.panic_detail(exc, work_dirs)}",
        " / ".join(t[len("error: ") :] for t in tail if t.strip() != "error:") or "see the log",
        f"read the {where}",
    )


# Beside the output channel's subdirs, never one of them: what lies here is not indexed, so a
# lock, an install or a build that uses the output folder as a channel never sees it.
REJECTED_DIR = "rejected"
WHEELS_DIR = "wheels"


def after_build(packages: list[BuiltPackage], channels: Sequence[str], build_env: Path | None = None, *,
                output: Path | None = None, wheel: bool = False, manylinux: tuple[int, int] | None = None) -> None:
    """Audit and stamp every built package against the host env its build used (`build_env`)
    where that holds the torch it pins, else the channel's; the glibc and CUDA driver the audit
    found it needs become run requirements. Then each goes into the output folder `output`
    (default: the one it is in, `<output>/<subdir>/`): one that passes into its subdir, one that
    fails into `rejected/` (kept for `extforge audit`, not served). With `wheel`, each package
    that passes also becomes a wheel in the output folder's `wheels/`, its search paths taken
    from the torch it was audited against. Audited, stamped and made a wheel of where it was
    built (the build's own work folder): the output folder may be a group's, whose members
    could change a package there between its audit and its stamp."""
    # What a wheel of a package built per torch (mamba-ssm's causal-conv1d) may require: the packages
    # built for the same torch in the channels and the output folder.
    outputs = {str(output or p.path.parent.parent) for p in packages}
    served = built_for_rows(all_records([*channels, *outputs])) if wheel else {}
    for pkg in packages:
        into = output or pkg.path.parent.parent
        report = audit_package(pkg.path, channel=channels[0] if channels else None, build_env=build_env)
        record = report.to_stamp(pkg.path)
        stamp_package(pkg.path, record, requires=run_requirements(record, pkg.cuda_toolkit))
        pkg.audit_verdict = report.verdict
        if wheel and report.ok and report.against:
            try:
                pkg.wheel = wheel_from_conda(pkg.path, into / WHEELS_DIR, Path(report.against), manylinux=manylinux,
                                             beneath=into, served=served).path
            except ExtforgeError as exc:
                pkg.wheel_refused = f"{exc.what} ({exc.fix})" if exc.fix else exc.what
        pkg.path = place(pkg.path, into / (pkg.path.parent.name if report.ok else REJECTED_DIR), into)
        if not report.ok:
            aside = pkg.path.parent
            first = next((f for f in report.findings if f.severity == "error"), None)
            against = f" --channel {shlex.quote(channels[0])}" if channels else ""
            log.warning("audit of %s: %s%s; kept aside in %s, not in the channel (every finding: `extforge audit %s%s`)",
                        pkg.path.name, report.verdict, f": {first.message} (fix: {first.fix})" if first else "", aside,
                        shlex.quote(str(pkg.path)), against)


def place(package: Path, folder: Path, output: Path) -> Path:
    """`package` moved into `folder` below the output folder `output` (no link followed there,
    whatever lies at its name replaced), mode 0644; where it is now."""
    if package.parent == folder:
        return package
    safe_files.make_dirs(folder, beneath=output)
    safe_files.move_in(package, folder / package.name, beneath=output)
    return folder / package.name


def ninja_log_in(work_dirs: Sequence[Path]) -> Path | None:
    # Under work/ only: the rest of the folder is the build and host envs (a torch env is ~20k files).
    return next((f for w in work_dirs for f in (w / "work").rglob(".ninja_log")), None)


def split_log_in(work_dirs: Sequence[Path]) -> Path | None:
    """The build layer's log of the units it compiled as parallel parts (activate.sh)."""
    return next((f for w in work_dirs if (f := w / "work" / ".extforge" / "split.log").is_file()), None)


# ninja's status line as pip -v passes it through: `[k/N] <command>` as each of the run's N edges ends.
NINJA_STATUS = re.compile(r"^\w+:\s*\[(\d+)/(\d+)\]\s")


@dataclass(frozen=True)
class Planned:
    """What a variant's build was planned from, so its progress is measured against the same plan."""

    profile: str
    variants: Mapping[str, list[str]]
    version: str | None = None
    units: int | None = None  # the sdist's translation units, for the default estimate


@contextlib.contextmanager
def progress_reports(sink: engine.LogSink, bld: Path, before: set[Path], planned: Planned,
                     on_progress: Callable[[plan.BuildProgress], None] | None = None,
                     interval: float = 10.0) -> Iterator[None]:
    """While the body runs (one variant's build), note at most every `interval` s how far its
    compile has come (plan.build_progress: units done of the plan's, the ninja run of the
    build's, the time left), to the build log and to `on_progress` (else the sink's screen), for
    every recipe whose build runs ninja: the long step of a build is otherwise one silent
    "running build script" of 8-25 minutes. It runs from the sink's log callback, as ninja and
    the compilers print (rattler-build holds the GIL while it builds: a thread of ours would not run)."""
    machine_now = machine.detect()
    archs = variant_archs(planned.variants) or plan.DEFAULT_ARCHS
    log: Path | None = None
    last = ""
    seen, status = len(sink.lines), None

    def report() -> None:
        nonlocal log, last, seen, status
        for line in sink.lines[seen:]:
            if m := NINJA_STATUS.match(line):
                status = (int(m[1]), int(m[2]))
        seen = len(sink.lines)
        # A running build's work root is in use: room-making (cache.make_room) leaves it alone.
        paths.mark_used(bld.parent)
        # Looked for until found: the variant's work folder appears once its build has started.
        log = log or ninja_log_in(sorted(set(bld.glob("rattler-build_*")) - before))
        # ninja creates its log when it starts and appends a line as each unit ends; a report
        # that fails (a line half written) waits for the next one.
        with contextlib.suppress(ExtforgeError, OSError, ValueError):
            if log is None:
                return
            written = log.stat().st_mtime
            # torch writes build.ninja beside the log before each ninja run (setuptools: one per
            # extension): written after the last unit ended, a run started that no unit ended yet.
            ninja_file = log.with_name("build.ninja")
            new_run = ninja_file.is_file() and ninja_file.stat().st_mtime > written
            progress = plan.build_progress(machine_now, planned.profile, archs,
                                           cost_store.read_log(log), time.time() - written,
                                           planned.variants, planned.version, planned.units, status, new_run)
            line = progress.describe()
            if line != last:
                sink.note(line, screen=on_progress is None)
                last = line
            # Every time: the screen decides what it shows (a line it held back comes later).
            if on_progress is not None:
                on_progress(progress)

    sink.tick, sink.tick_every = report, interval
    try:
        yield
    finally:
        sink.tick = None


def measured_node_speed(profile: str, work_dirs: Sequence[Path], variants: Mapping[str, list[str]],
                        env: Mapping[str, str], split_log: Path | None, cached: Collection[str] = ()) -> float | None:
    """This machine's compile speed in the build just done, read from ninja's log in its work
    folder before the folder is removed (`extforge plan --node-speed` for the next build here),
    on the units it compiled: those the compile cache served (`cached`) time a copy."""
    log = ninja_log_in(work_dirs)
    if log is None:
        return None
    with contextlib.suppress(ExtforgeError, OSError, ValueError):
        return plan.build_node_speed(profile, cost_store.read_log(log),
                                     variant_archs(variants) or plan.DEFAULT_ARCHS, int(env.get("NVCC_THREADS", "1")),
                                     split={*cost_store.read_split_log(cost_store.read_log(split_log)).parts, *cached})
    return None


def cache_hit_units(state_dir: Path) -> set[str]:
    """The units the compile cache served in the variant just built, by ccache's stats log
    (none known through sccache, which keeps none)."""
    with contextlib.suppress(OSError, ExtforgeError):
        return unit_costs.cache_hits(parts.read_verdicts(state_dir))
    return set()


def finish_part(part: parts.Part, state_dir: Path, work_dirs: Sequence[Path], packages: Sequence[BuiltPackage],
                fh: Any, notes: list[str], work_root: Path) -> None:
    """A part is done: its objects are in the compile cache; what it built around them (placeholder
    objects and links, maybe a package of them) is removed, never packaged or indexed. Its ninja
    log (the units it compiled: their real seconds) and unit notes stay beside its build log."""
    note_outcome(part, state_dir, fh, notes)
    keep_beside_log(Path(fh.name), [(ninja_log_in(work_dirs), ".ninja_log"), (state_dir / "units", ".units")], work_root)
    for path in [*work_dirs, *(p.path for p in packages)]:
        safe_files.remove_quietly(path, beneath=work_root)


def keep_beside_log(log_file: Path, files: Sequence[tuple[Path | None, str]], work_root: Path) -> None:
    """Copies of a build's files (below its work root) beside its build log in the output folder,
    named like it (`<log>.ninja_log`: the units' real seconds, for `extforge plan --compare` or a
    look at the schedule)."""
    output_dir = log_file.parent.parent
    for src, suffix in files:
        with contextlib.suppress(OSError, ExtforgeError):
            if src is not None:
                data = shared_read.read_bytes(src, limit=cost_store.LOG_LIMIT, beneath=work_root)
                safe_files.write_atomic(log_file.with_suffix(suffix), data, beneath=output_dir)


def note_outcome(part: parts.Part, state_dir: Path, fh: Any, notes: list[str]) -> parts.Outcome:
    """What a part or a link job did, into its build log and the notes the command prints."""
    outcome = parts.read_outcome(state_dir)
    summary = outcome.summary(part)
    fh.write(f"extforge: {summary}\n")
    fh.flush()
    notes.append(summary)
    return outcome


def report_link(part: parts.Part, state_dir: Path, fh: Any, notes: list[str]) -> None:
    outcome = note_outcome(part, state_dir, fh, notes)
    if outcome.cache_misses:
        many = outcome.cache_misses != 1
        log.warning("%s: %d unit%s not in the compile cache and compiled here (a part failed, did not run, or ran "
                    "with other sources or flags; or the unit's headers expand __FILE__, which names this build's "
                    "own folder: FA3's flash_prepare_scheduler)", part.describe(), outcome.cache_misses,
                    "s were" if many else " was")


def build_recipe(options: BuildOptions, on_step: Callable[[str], None] | None = None,
                 notes: list[str] | None = None,
                 on_progress: Callable[[plan.BuildProgress], None] | None = None) -> list[BuiltPackage]:
    """Build `options.recipe` into `options.output_dir` (an indexed channel) and return the packages
    it made; a part of a build in parts makes none. What a part or a link job did is added to `notes`;
    how far each compile has come goes to `on_progress` (else `on_step`, as a line).
    Planned from the site's costs for the recipe, else those its folder ships."""
    recipe_file = engine.find_recipe(options.recipe)
    folder = recipe_file.parent.resolve()
    with cost_store.recipe_costs(recipe_file.parent), work_folder(folder.name) as work_root:
        # rattler-build reads the copy checked as it was made (recipes.trust), never the folder again.
        copies = work_root / RECIPE_COPY
        safe_files.make_private_dir(copies, beneath=work_root)
        copy = trust.checked(recipe_file, copies)
        try:
            return _build_recipe(options, copy, on_step, [] if notes is None else notes, on_progress, work_root)
        except ExtforgeError as exc:
            # What the user fixes is their recipe, not its copy.
            exc.what, exc.why, exc.fix = (t.replace(str(copy.parent), str(folder)) for t in (exc.what, exc.why, exc.fix))
            raise


# Where rattler-build works (its output folder): a new folder of this user's alone for every build,
# in its own area of the cache (paths.own_area). Never the output folder: a group may share that
# (docs/site-admin.md), and what rattler-build makes there with the builder's umask (its work
# folders' sources, build.ninja, host and build prefixes, the layer's settings and order files,
# the packages before their audit) a member could change while the build runs, or own outright
# by making `bld/` first. Only the audited packages, the logs and the wheels go there.
WORK_AREA = "builds"
# The recipe's folder copied into the work folder (below it under its own name).
RECIPE_COPY = "recipe"


def no_space(path: Path, what: str, fix: str) -> None:
    if re.search(r"\s", str(path)):
        raise ExtforgeError(
            f"cannot build {what} {path}: its path holds a space",
            "build scripts split the paths of the build's environments on spaces (a recipe's "
            "`${{ PYTHON }} -m pip install .` ran '/first/word' and failed with 127)", fix)


@contextlib.contextmanager
def work_folder(name: str) -> Iterator[Path]:
    """A new folder only this user can reach (0700, made by this run), for rattler-build's
    output. Removed at the end unless the error a build failed with names it (a work folder kept
    to look at)."""
    area = paths.own_area(WORK_AREA)
    no_space(area, "in", "point EXTFORGE_CACHE at a folder whose path has no spaces")
    safe_files.make_dirs(area.parent)
    safe_files.make_private_dir(area)
    root = area / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:40]}-{secrets.token_hex(6)}"
    safe_files.make_private_dir(root, beneath=area, exist_ok=False)
    named = False
    try:
        yield root
    except ExtforgeError as exc:
        named = str(root) in exc.render()
        raise
    finally:
        if not named:
            safe_files.remove_quietly(root, beneath=area)


def _build_recipe(options: BuildOptions, recipe_file: Path, on_step: Callable[[str], None] | None,
                  notes: list[str], on_progress: Callable[[plan.BuildProgress], None] | None,
                  work_root: Path) -> list[BuiltPackage]:
    # rattler reads os.getcwd() when first imported (ChannelConfig's default root_dir); after a
    # 25-minute compile the working directory may be gone, so it is imported before the build.
    import rattler  # noqa: F401

    urls = [channel_url(c) for c in options.channels]
    if not urls:
        raise ExtforgeError(
            "no channel given",
            "extforge build never falls back to conda-forge (unreachable offline)",
            "pass --channel DIR_OR_URL, e.g. the folder `extforge mirror` wrote",
        )
    output_dir = options.output_dir.resolve()
    no_space(output_dir, "into", "pass an --output-dir whose path has no spaces")
    safe_files.make_dirs(output_dir)
    engine.prepare_environment()
    matrix = resolve_variants(recipe_file, urls, options.variant_configs, options.variants)
    merged, files = matrix.values, matrix.files
    recipe_text = recipe_file.read_text()
    # Costs are the package's (its name, not the folder's: a folder renamed keeps them).
    profile = options.profile or cost_store.recipe_name(recipe_text) or recipe_file.parent.name
    # Every url source from the source cache, fetched into it (verified) where it lacks one: the
    # recipe is rendered to read it there, so rattler-build never downloads.
    source_root = sources.build_root()
    local_sources = sources.for_build(recipe_file, matrix.config(), source_root)
    units = next((n for spec, path in local_sources if spec.is_sdist and (n := scaffold.sdist_units(path))), None)
    planned = Planned(profile, merged, cost_store.recipe_version(recipe_text), units)
    bld = work_root / "bld"
    part, parts_state = options.part, parts.state_dir(bld)
    env = build_environment(recipe_text, urls, merged, profile, part, units)
    if part:
        env |= part_environment(env, part, profile, cost_store.recipe_version(recipe_text), merged, parts_state)
    elif "CCACHE_DIR" in env:
        # ccache's verdict on every compile (the launcher of a build in parts sets its own), in the
        # build's own work folder: the planner learns only the units compiled, never a cache hit's copy.
        env["CCACHE_STATSLOG"] = str(work_root / parts.STATS_LOG)
    verdicts = parts_state if part else work_root
    # Rendered before the log opens: a variant problem is refused before anything is solved or compiled.
    rendered = render_in(env | {sources.ENV: str(source_root)}, recipe_file, matrix)
    trust.outside_sources(rendered, recipe_file)
    # rattler-build extracts local packages unhashed (its own output, the new work root, holds
    # only what this build makes; the output folder is a channel only where -c names it).
    claims = local_archives.channel_claims(urls, SUBDIRS)
    local_archives.check(claims)
    local_archives.vouch_entries(claims, paths.rattler_pkgs_dir())
    make_room(paths.cache_root(), f"building {recipe_file.parent.name}")
    log_dir = output_dir / "logs"
    safe_files.make_dirs(log_dir, beneath=output_dir)
    log_file = log_dir / f"{recipe_file.parent.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.info("build log: %s; variant files: %s; env: %s", log_file, [str(f) for f in files], env)
    built: list[BuiltPackage] = []
    # rattler-build starts build scripts with a clean environment: the layer reads these from a file.
    layer_settings = {k: v for k, v in env.items() if k != "CONDA_OVERRIDE_CUDA"}
    uses_layer = build_layer.uses_layer(recipe_text)
    if not uses_layer and build_layer.builds_torch_extension(recipe_text):
        log.warning("%s compiles against torch without %s in its build requirements: its build may download, "
                    "compile other GPU archs than its variant's, or pick its own C++ standard; add the package "
                    "(every `extforge mirror` channel has it) to requirements.build", recipe_file, build_layer.LAYER_PACKAGE)
    # The output folder may be a group's: a link planted at the log's name is refused, not written through.
    with safe_files.new_text_file(log_file, beneath=output_dir) as fh, environment(env), stopping.stoppable() as stop:
        fh.write(f"# recipe {options.recipe} (a copy: {recipe_file})\n# channels {urls}\n# variants {merged}\n# env {env}\n")
        sink = engine.LogSink(fh, on_step)
        # One variant at a time, each work folder kept until its packages are audited against
        # the host env that built them, then deleted (a large recipe's holds GBs of objects).
        for variant in rendered:
            before = set(bld.glob("rattler-build_*"))
            tests_before = set(rattler_test_envs(work_root))
            if uses_layer:
                build_layer.write_settings(work_root, layer_settings)
            parts.clear_notes(verdicts)
            try:
                with progress_reports(sink, bld, before, planned, on_progress), stop.engine():
                    # A part's module is placeholders: nothing to test.
                    result = engine.build_variant(variant, work_root, urls, sink, keep_build=True,
                                                  test=options.test and not (part and not part.is_link))
            except BaseException as exc:
                if not engine.engine_failure(exc):
                    raise
                kept = sorted(set(bld.glob("rattler-build_*")) - before)
                if stop.signal:
                    # Not a failure to diagnose: the compilers died because they were told to.
                    for work in kept:
                        safe_files.remove_quietly(work, beneath=work_root)
                    fh.write(f"extforge: build stopped by {stop.name}; its work folders were removed\n")
                    fh.flush()
                    stop.check()
                if part and not part.is_link and parts.part_reached_link(parts_state):
                    # What fails after a part's placeholder links (an import test, a relink) is expected.
                    finish_part(part, parts_state, kept, [], fh, notes, work_root)
                    continue
                if failed_solve(exc):
                    # Nothing ran yet: the work folder holds only a copy of the sources.
                    for work in kept:
                        safe_files.remove_quietly(work, beneath=work_root)
                    kept = []
                failure = build_failure(exc, sink.lines, urls, recipe_file, log_file, kept, (work_root, output_dir))
                set_aside_broken(work_root, output_dir)
                # The log ends with what the console said, so `extforge explain --file LOG` sees it too.
                fh.write(f"error: {engine.engine_message(exc)}\n{failure.render()}\n")
                fh.flush()
                raise failure from exc
            finally:
                # Read once, by this variant's activation: nothing of the build stays behind.
                safe_files.remove_quietly(bld / build_layer.SETTINGS_FILE, beneath=work_root)
            toolkit = str(variant.variant.get("cuda_compiler_version", ""))
            packages = [BuiltPackage(Path(p), result.name, result.version, result.build_string, result.platform,
                                     cuda_toolkit=toolkit if toolkit[:1].isdigit() else None)
                        for p in result.packages]
            work_dirs = sorted(set(bld.glob("rattler-build_*")) - before)
            if part and not part.is_link:
                finish_part(part, parts_state, work_dirs, packages, fh, notes, work_root)
                continue
            split_log = split_log_in(work_dirs)
            cached = cache_hit_units(verdicts)
            speed = measured_node_speed(profile, work_dirs, merged, env, split_log, cached)
            if part:
                # A link job's log times cache hits, not compiles: it teaches the cost store nothing.
                report_link(part, parts_state, fh, notes)
            else:
                ninja_log = ninja_log_in(work_dirs)
                cost_store.learn_from_build(profile, result.version, ninja_log,
                                            variant_archs(merged) or plan.DEFAULT_ARCHS, env, split_log, cached)
                keep_beside_log(Path(fh.name), [(ninja_log, ".ninja_log"), (split_log, ".split.log")], work_root)
            for pkg in packages:
                pkg.node_speed = speed
            try:
                if options.audit:
                    after_build(packages, urls, next(filter(None, map(engine.host_env, work_dirs)), None),
                                output=output_dir, wheel=options.wheel, manylinux=options.manylinux)
                else:
                    for pkg in packages:
                        pkg.path = place(pkg.path, output_dir / pkg.path.parent.name, output_dir)
            finally:
                # The tests passed: their environments (a torch env is ~5 GB, copied, not linked)
                # have nothing left to show. A failed test keeps its own, like a failed build.
                for work in [*work_dirs, *(set(rattler_test_envs(work_root)) - tests_before)]:
                    safe_files.remove_quietly(work, beneath=work_root)
            built += packages
    local_archives.vouch_extracted(claims, paths.rattler_pkgs_dir())
    index_channel(output_dir)
    return built
