"""`extforge verify --slurm`: the same verification on every node of a partition.

srun starts one task per node with labelled output (`--label`), so no shared scratch
folder is needed: each task prints its node name, verify's JSON document and its exit
status, and the lines are regrouped by task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ExtforgeError
from ..ui import console
from .config import SlurmConfig
from .nodes import partition_nodes
from .state import run_slurm
from .submit import extforge_argv

# Prints the node's name, runs the command, prints its exit status: three facts per task.
TASK_WRAPPER = 'echo "@node ${SLURMD_NODENAME:-$(hostname)}"; "$@"; echo "@exit $?"'
FINDINGS_SHOWN = 3


@dataclass
class NodeRow:
    node: str
    verdict: str  # pass | fail | error (verify could not run) | unreachable (node not usable)
    reasons: list[str] = field(default_factory=list)
    report: dict | None = None

    def to_json(self) -> dict:
        return {"node": self.node, "verdict": self.verdict, "reasons": self.reasons, "report": self.report}


@dataclass
class TaskOutput:
    node: str | None = None
    exit_code: int | None = None
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


def split_labelled(stdout: str, stderr: str) -> tuple[dict[int, TaskOutput], list[str]]:
    """srun --label output → per-task output, plus srun's own (unlabelled) messages."""
    tasks: dict[int, TaskOutput] = {}
    srun_messages: list[str] = []
    for text, is_err in ((stdout, False), (stderr, True)):
        for line in text.splitlines():
            label, sep, rest = line.partition(": ")
            if not sep or not label.strip().isdigit():
                if line.strip():
                    srun_messages.append(line)
                continue
            t = tasks.setdefault(int(label), TaskOutput())
            if is_err:
                t.stderr.append(rest)
            elif rest.startswith("@node "):
                t.node = rest[6:].strip()
            elif rest.startswith("@exit ") and rest[6:].strip().isdigit():
                t.exit_code = int(rest[6:])
            else:
                t.stdout.append(rest)
    return tasks, srun_messages


def verdict_row(node: str, task: TaskOutput) -> NodeRow:
    """A node's verdict from verify's JSON (`ok` and its failing checks) or, without it, stderr."""
    try:
        doc = json.loads("\n".join(task.stdout))
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        tail = [line for line in task.stderr if line.strip()][-3:]
        return NodeRow(node, "error", tail or [f"verify printed no report (exit {task.exit_code})"])
    if "error" in doc and "checks" not in doc:
        return NodeRow(node, "error", [f"{doc['error']}: {doc.get('why', '')}".rstrip(": ")], doc)
    reasons = []
    for check in doc.get("checks", []):
        if check.get("verdict") == "fail":
            reasons.append(f"{check['name']}: {check.get('summary', '')}")
            reasons += [f"  {f}" for f in check.get("findings", [])[:FINDINGS_SHOWN]]
    ok = bool(doc.get("ok")) and task.exit_code in (0, None)
    return NodeRow(node, "pass" if ok else "fail", reasons, doc)


def srun_argv(config: SlurmConfig, nodes: list[str], verify_argv: list[str]) -> list[str]:
    argv = ["srun", "--label", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--cpus-per-task=1", f"--mem={config.verify_mem}",
            "--job-name=extforge:verify", "--kill-on-bad-exit=0"]
    for flag, value in (("--partition", config.partition), ("--account", config.account), ("--qos", config.qos)):
        if value:
            argv.append(f"{flag}={value}")
    argv += list(config.extra_args)
    return argv + ["sh", "-c", TASK_WRAPPER, "sh", *extforge_argv(config), "verify", *verify_argv, "--json"]


def rows_from_run(nodes: list[str], stdout: str, stderr: str) -> list[NodeRow]:
    tasks, srun_messages = split_labelled(stdout, stderr)
    by_node = {t.node: t for t in tasks.values() if t.node}
    rows = []
    for name in nodes:
        task = by_node.get(name)
        if task is None:
            rows.append(NodeRow(name, "error", srun_messages[-3:] or ["no task ran on this node"]))
        else:
            rows.append(verdict_row(name, task))
    return rows


def verify_on_nodes(config: SlurmConfig, verify_argv: list[str], nodelist: str | None = None) -> list[NodeRow]:
    all_nodes = partition_nodes(config.partition)
    if nodelist:
        wanted = set(expand_hostlist(nodelist))
        all_nodes = [n for n in all_nodes if n.name in wanted]
        if not all_nodes:
            raise ExtforgeError(f"none of {nodelist} is in the partition", "", "check the names with `sinfo -N`")
    usable = [n.name for n in all_nodes if n.usable]
    rows = {n.name: NodeRow(n.name, "unreachable", [f"node state {n.state}"]) for n in all_nodes if not n.usable}
    if usable:
        proc = run_slurm(srun_argv(config, usable, verify_argv))
        for row in rows_from_run(usable, proc.stdout, proc.stderr):
            rows[row.node] = row
    return [rows[n.name] for n in all_nodes]


def expand_hostlist(text: str) -> list[str]:
    """Slurm hostlist syntax (gpu[01-03,07],login1) → names, via `scontrol show hostnames`."""
    proc = run_slurm(["scontrol", "show", "hostnames", text])
    if proc.returncode != 0:
        raise ExtforgeError(f"bad node list {text!r}", proc.stderr.strip(), "use Slurm hostlist syntax, e.g. gpu[01-04]")
    return proc.stdout.split()


def print_node_rows(rows: list[NodeRow]) -> None:
    from rich.table import Table

    style = {"pass": "green", "fail": "red", "error": "red", "unreachable": "yellow"}
    table = Table(show_edge=False, pad_edge=False)
    for col in ("node", "verdict", "why"):
        table.add_column(col)
    for r in rows:
        s = style[r.verdict]
        table.add_row(r.node, f"[{s}]{r.verdict}[/{s}]", "\n".join(r.reasons) or "-")
    console.print(table)
