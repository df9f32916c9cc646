#!/usr/bin/env python3
"""Where a run's CPU goes: which tests, which of their programs, and the seed rows' background.

  bench/cpu_profile.py run OUT.json -- COMMAND...      sample /proc while COMMAND runs
  bench/cpu_profile.py report OUT.json JUNIT.xml       CPU per test file and per program

The suite is CPU-bound on 2 cores when cold, so its wall time is set by the CPU work of its
tests and of the seed rows' background (tests/seed/prepare.py, at the lowest priority): wall
figures alone cannot say which work to cut. `run` samples every process's own CPU seconds from
/proc twice a second and keeps, per process, its program, the test process it belongs to
(the background or the foreground) and its CPU over time in 5-second bins; the machine's busy
and idle seconds come from /proc/stat, in total and per bin (where the cores sat idle). A process
that lives under half a second is seen only by the machine's total ("unseen" in the report).
`report` places each bin in the test that ran then (pytest's junit file: the tests run one after
another, each with its set-up and teardown), and prints the top test files by CPU and the
programs that used it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.5
BIN_S = 5
BACKGROUND_MARK = "seed.prepare"


@dataclass
class Proc:
    program: str
    group: str
    cpu: float = 0.0
    bins: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def _stat(pid: str) -> tuple[str, int, float] | None:
    """(program, parent pid, own CPU seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The program name is in parentheses and may hold spaces: split after its closing one.
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return name, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _program(name: str, cmdline: str) -> str:
    """What the process runs, a python by its script or module (`python -m extforge` is extforge)."""
    if not name.startswith("python"):
        return name
    args = cmdline.split()[1:]
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return f"python -m {args[i + 1]}"
        if not arg.startswith("-"):
            return f"python {Path(arg).name}"
    return name


def _machine_busy() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the machine since boot, every core."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK, idle / TICK


def record(out: Path, command: list[str]) -> int:
    root = subprocess.Popen(command)
    t0 = time.monotonic()
    busy0, idle0 = _machine_busy()
    procs: dict[str, Proc] = {}
    parents: dict[str, str] = {}
    groups: dict[str, str] = {str(root.pid): "foreground"}
    machine_bins: dict[int, float] = defaultdict(float)
    last_busy = busy0
    while root.poll() is None:
        now_bin = int((time.monotonic() - t0) // BIN_S)
        busy, _ = _machine_busy()
        machine_bins[now_bin] += busy - last_busy
        last_busy = busy
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            stat = _stat(pid)
            if stat is None:
                continue
            name, ppid, cpu = stat
            parents[pid] = str(ppid)
            proc = procs.get(pid)
            if proc is None:
                group = _group(pid, parents, groups)
                if group is None:
                    continue
                proc = procs[pid] = Proc(_program(name, _cmdline(pid)), group)
            proc.bins[now_bin] += cpu - proc.cpu
            proc.cpu = cpu
        time.sleep(SAMPLE_S)
    busy1, idle1 = _machine_busy()
    out.write_text(json.dumps({
        "wall_s": time.monotonic() - t0, "machine_busy_s": busy1 - busy0, "machine_idle_s": idle1 - idle0,
        "bin_s": BIN_S, "command": command, "cores": os.cpu_count(), "machine_bins": machine_bins,
        "procs": [{"program": p.program, "group": p.group, "cpu_s": p.cpu, "bins": p.bins} for p in procs.values()],
    }))
    return root.returncode


def _group(pid: str, parents: dict[str, str], groups: dict[str, str]) -> str | None:
    """The background if the seed rows' process is among its ancestors, else the foreground;
    None for a process outside the command's tree (a pid reused later is new: the caller keys by pid)."""
    chain = []
    cur = pid
    while cur not in groups and cur in parents and cur not in ("0", "1"):
        chain.append(cur)
        cur = parents[cur]
    group = groups.get(cur)
    if group is None:
        return None
    for p in reversed(chain):
        if group == "foreground" and BACKGROUND_MARK in _cmdline(p):
            group = "background"
        groups[p] = group
    return group


def _test_spans(junit: Path) -> list[tuple[str, float]]:
    """(test file, seconds) in the order pytest ran them, consecutive tests of a file merged."""
    spans: list[tuple[str, float]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        # classname is the module path with dots ("tests.seed.test_x" or "...test_x.TestClass").
        module = "/".join(n for n in name if not n[:1].isupper()) + ".py"
        secs = float(case.get("time", 0.0))
        if spans and spans[-1][0] == module:
            spans[-1] = (module, spans[-1][1] + secs)
        else:
            spans.append((module, secs))
    return spans


def report(profile: Path, junit: Path, top: int) -> None:
    data = json.loads(profile.read_text())
    bin_s = data["bin_s"]
    spans = _test_spans(junit)
    # The tests start after the checks, venv and collection: place the last test's end at the end.
    start = data["wall_s"] - sum(s for _, s in spans)
    edges = []
    t = start
    for module, secs in spans:
        edges.append((t, t + secs, module))
        t += secs

    def test_at(seconds: float) -> str:
        for lo, hi, module in edges:
            if lo <= seconds < hi:
                return module
        return "(before the tests: set-up, checks, collection)" if seconds < start else "(after)"

    per_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_program: dict[tuple[str, str], float] = defaultdict(float)
    wall_per_file: dict[str, float] = defaultdict(float)
    for module, secs in spans:
        wall_per_file[module] += secs
    seen = 0.0
    for proc in data["procs"]:
        per_program[(proc["group"], proc["program"])] += proc["cpu_s"]
        seen += proc["cpu_s"]
        for b, cpu in proc["bins"].items():
            per_file[test_at((int(b) + 0.5) * bin_s)][proc["group"]] += cpu
    print(f"wall {data['wall_s']:.0f} s; machine busy {data['machine_busy_s']:.0f} CPU-s, idle "
          f"{data['machine_idle_s']:.0f} CPU-s; seen in processes {seen:.0f} CPU-s "
          f"(unseen: {data['machine_busy_s'] - seen:.0f}, short-lived processes and other users' work)")
    print(f"\ntop {top} test files by foreground CPU (background CPU while they ran beside):")
    print("| test file | wall s | foreground CPU-s | background CPU-s |\n|---|---:|---:|---:|")
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1].get("foreground", 0.0))
    for module, groups in ranked[:top]:
        print(f"| {module} | {wall_per_file.get(module, 0.0):.0f} | {groups.get('foreground', 0.0):.0f} | "
              f"{groups.get('background', 0.0):.0f} |")
    if "machine_bins" in data:
        minutes: dict[int, float] = defaultdict(float)
        for b, busy in data["machine_bins"].items():
            minutes[int(b) * bin_s // 60] += busy
        # The machine that ran the command, not the one reading its profile.
        print("\nthe machine's cores busy, minute by minute: " + " ".join(
            f"{m}:{minutes[m] / 60:.1f}" for m in sorted(minutes)) + f" (of {data['cores']})")
    print(f"\ntop {top} programs by CPU:")
    print("| group | program | CPU-s |\n|---|---|---:|")
    for (group, program), cpu in sorted(per_program.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {group} | {program} | {cpu:.0f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="sample /proc while a command runs")
    r.add_argument("out", type=Path)
    r.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("report", help="CPU per test file and per program")
    p.add_argument("profile", type=Path)
    p.add_argument("junit", type=Path)
    p.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if args.cmd == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            ap.error("run needs a command after --")
        return record(args.out, command)
    report(args.profile, args.junit, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
