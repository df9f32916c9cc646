"""Builds that outlive the call that starts them: detached, with a memory and compiler sampler
beside each, and a `.done` file (exit code, start, end) that a later phase waits for.

A later call may lay the synced tree anew while a chained build still waits (run U's plain side:
`can't open file 'bench/build_side_by_side.py'`), so a detached build runs from a copy of the
tree's code in the work folder (`snapshot`), by absolute paths."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .node import cpu_list
from .state import REPO, Run, now

# What a detached build reads from the tree: extforge, the recipes, the bench scripts.
SNAPSHOT_PARTS = ("src", "recipe", "bench")


def snapshot(work: Path, repo: Path = REPO) -> Path:
    """work/tree: a copy of the tree's code, taken anew by `start`, from which detached builds run."""
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    for part in SNAPSHOT_PARTS:
        shutil.copytree(repo / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def tool_env(work: Path, root: Path = REPO) -> dict[str, str]:
    """extforge from `root` (the checkout, or the snapshot for a detached build), its
    dependencies from the bundled site tree if present."""
    env = os.environ.copy()
    site = work / "site"
    paths = [str(root / "src")] + ([str(site)] if site.is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PATH"] = os.pathsep.join([str(site / "bin"), str(work / "ccache" / "bin"), env.get("PATH", "")])
    env["EXTFORGE_CACHE"] = str(work / "cache")
    env["EXTFORGE_SOURCES"] = str(work / "sources")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def build_script(work: Path, out_dir: str, cmd: Sequence[str], cwd: Path, after: Sequence[str] = ()) -> str:
    """The detached shell line of one build: wait for the builds `after`, then run `cmd` in `cwd`
    (an absolute path, entered only once the wait is over), its exit code and times in OUT_DIR.done."""
    wait = "".join(f"while [ ! -e {shlex.quote(str(work / a))}.done ]; do sleep 2; done; " for a in after)
    logs, done = shlex.quote(str(work / "logs" / f"{out_dir}.log")), shlex.quote(str(work / f"{out_dir}.done"))
    return (f"{wait}cd {shlex.quote(str(cwd))} && start=$(date +%s.%N); {shlex.join(cmd)} > {logs} 2>&1; rc=$?; "
            f"end=$(date +%s.%N); echo \"$rc $start $end\" > {done}")


def sampler_script(work: Path, out_dir: str, after: Sequence[str] = ()) -> str:
    """Memory peak, the largest compiler process (the planner's per-job figure, and a peak of the
    build's own where other work shares the node), the first nvcc (how long the build waits
    before compiling) and the busy compilers every 2 s (whether the last minutes still use every
    job slot)."""
    wait = "".join(f"while [ ! -e {shlex.quote(str(work / a))}.done ]; do sleep 2; done; " for a in after)
    w = shlex.quote(str(work / out_dir))
    return (
        f"{wait}free -b | awk '/^Mem:/{{print $3}}' > {w}.base; t0=$(date +%s.%N); peak=0; while [ ! -e {w}.done ]; do "
        "used=$(free -b | awk '/^Mem:/{print $3}'); [ $used -gt $peak ] && peak=$used; "
        f"echo $peak > {w}.peak; n=$(pgrep -x nvcc | wc -l); "
        "p=$(ps -C cicc,ptxas,cc1plus,cudafe++ -o rss= | sort -n | tail -1); [ \"${p:-0}\" -gt \"${proc:-0}\" ] && proc=$p; "
        f"echo ${{proc:-0}} > {w}.peak-proc; "
        "t=$(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf \"%.1f\", b-a}'); "
        f"echo \"$t $n\" >> {w}.jobs; [ $n -gt 0 ] && [ ! -e {w}.first-nvcc ] && echo $t > {w}.first-nvcc; "
        "sleep 2; done"
    )


def start_build(run: Run, env: Mapping[str, str], out_dir: str, cmd: list[str], after: Sequence[str] | None = None,
                cpus: list[int] | None = None) -> None:
    """Start a long build detached (it outlives this call) from the work folder's snapshot, with
    a sampler beside it; with `after`, both wait until those builds are done; with `cpus`, the
    build runs on those CPUs alone (its planner sees them as the machine's cores)."""
    (run.work / "logs").mkdir(parents=True, exist_ok=True)
    if cpus:
        cmd = ["taskset", "-c", cpu_list(cpus), *cmd]
    tree = run.work / "tree"
    for script in (build_script(run.work, out_dir, cmd, tree, after or ()), sampler_script(run.work, out_dir, after or ())):
        subprocess.Popen(["setsid", "bash", "-c", script], env=dict(env), cwd=run.work, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # Also the mark that the build was started; a build that waits re-reads its idle base when it starts.
    base = subprocess.run(["free", "-b"], capture_output=True, text=True).stdout.split("\n")[1].split()[2]
    (run.work / f"{out_dir}.base").write_text(base)
    run.fact(f"{out_dir} started", f"when {' and '.join(after)} end" if after else now())


def parse_done(text: str) -> tuple[int, float, float]:
    """A .done file: exit code, start and end (epoch seconds)."""
    rc, start, end = text.split()
    return int(rc), float(start), float(end)


def progress_line(out_dir: str, log_text: str) -> str:
    """How far a build is, from ninja's [n/N] lines in its logs."""
    steps = re.findall(r"\[(\d+)/(\d+)\]", log_text)
    return f"{out_dir}: {steps[-1][0]}/{steps[-1][1]} compile steps" if steps else f"{out_dir}: preparing"


def wait_build(run: Run, out_dir: str, deadline: float) -> bool:
    """Wait for a background build until `deadline` (time.monotonic()); one deadline for every
    build a command waits for, so the command ends inside a job step's limit."""
    done = run.work / f"{out_dir}.done"
    log = run.work / "logs" / f"{out_dir}.log"
    if not (run.work / f"{out_dir}.base").exists():
        # An earlier step failed before the build was started: nothing will ever finish.
        print(f"{out_dir} was never started", flush=True)
        return False
    last = ""
    while not done.exists() and time.monotonic() < deadline:
        # rattler-build's own log (in the output folder) carries ninja's [n/N] progress.
        line = progress_line(out_dir, "".join(f.read_text(errors="replace")
                                              for f in [*(run.work / out_dir / "logs").glob("*.log"), log] if f.exists()))
        if line != last:
            print(time.strftime("%H:%M:%S"), line, flush=True)
            last = line
        time.sleep(10)
    if not done.exists():
        print(f"{out_dir} still running", flush=True)
        return False
    rc, start, end = parse_done(done.read_text())
    if not run.has_step(f"build {out_dir}"):
        peak = int((run.work / f"{out_dir}.peak").read_text() or 0) - int((run.work / f"{out_dir}.base").read_text())
        tail = "".join(f.read_text(errors="replace") for f in (run.work / out_dir / "logs").glob("*.log"))
        run.record(f"build {out_dir}", end - start, rc == 0,
                   (log.read_text(errors="replace")[-1500:] + tail[-1500:] if rc else ""))
        run.fact(f"{out_dir} wall", f"{end - start:.0f} s")
        run.fact(f"{out_dir} peak RAM above idle", f"{peak / 2**30:.1f} GiB")
        proc = run.work / f"{out_dir}.peak-proc"
        if proc.exists():
            run.fact(f"{out_dir} largest compiler process", f"{int(proc.read_text() or 0) / 2**20:.2f} GiB")
        if speed := re.search(r"--node-speed ([\d.]+)", log.read_text(errors="replace")):
            run.fact(f"{out_dir} node speed (against the planner's unit costs)", speed.group(1))
        collect_build_probes(run, out_dir)
    return rc == 0


def collect_build_probes(run: Run, out_dir: str) -> None:
    """What the samplers and ninja saw, copied out now: the node may be gone after this call."""
    first = run.work / f"{out_dir}.first-nvcc"
    if first.exists():
        run.fact(f"{out_dir} first nvcc after", f"{first.read_text().strip()} s")
    for src, name in ((run.work / f"{out_dir}.jobs", f"{out_dir}.jobs"),
                      (next((run.work / out_dir).rglob(".ninja_log"), None), f"{out_dir}.ninja_log")):
        if src is not None and src.exists():
            shutil.copyfile(src, run.work / "logs" / name)
    # rattler-build removes its work folder after a build that passed: the whole log is then only
    # in the package (share/extforge/build/), and the unit costs are fitted from whole logs.
    for package in (run.work / out_dir / "linux-64").glob("*.conda"):
        log = packaged_file(package, lambda name: name.endswith(".ninja_log"))
        if log is not None:
            (run.work / "logs" / f"{out_dir}.ninja_log").write_bytes(log)


def packaged_file(package: Path, wanted: Callable[[str], bool]) -> bytes | None:
    """The first payload file of `package` whose path `wanted` takes."""
    from extforge.archive import package_tars

    for tar in package_tars(package, "pkg"):
        for member in tar:
            if wanted(member.name) and member.isfile():
                fh = tar.extractfile(member)
                return fh.read() if fh else None
    return None
