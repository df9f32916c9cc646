"""The work folder's record of a run, shared by its phases (each is a separate call, possibly on
a node that is gone by the next): steps, facts, the phases run, and the options `start` was
given; the summary written from it after every change."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PHASES = ("start", "wait", "finish", "wheels", "rebuild", "all", "symbols", "carry")
# What `start` decides and every later phase must see the same way: `finish --env fa3` after
# `start --fa3` used to lock without flash-attn-3, its packages never published.
REMEMBERED = ("python", "archs", "head_dims", "no_flash_attn", "fa3", "fa3_head_dims", "fa3_dtypes", "fa3_features",
              "fa3_parts", "side_by_side", "cuda_home", "extras")


class StepFailed(Exception):
    pass


def new_state() -> dict[str, Any]:
    return {"started": datetime.now(UTC).isoformat(timespec="seconds"), "steps": [], "facts": {}, "phases": [],
            "options": {}}


def load_state(state_file: Path) -> dict[str, Any]:
    """The record so far, or a new one; a record written before phases and options were kept
    gets empty ones."""
    if not state_file.exists():
        return new_state()
    state: dict[str, Any] = json.loads(state_file.read_text())
    state.setdefault("phases", [])
    state.setdefault("options", {})
    return state


def merged_options(given: Mapping[str, Any], saved: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The options a phase runs with: what this call gave (not None), else what an earlier phase
    remembered, else the default. Only REMEMBERED keys are taken from `saved`."""
    out = dict(defaults)
    out |= {k: v for k, v in saved.items() if k in REMEMBERED}
    out |= {k: v for k, v in given.items() if v is not None}
    return out


def render_summary(state: Mapping[str, Any]) -> str:
    lines = [f"# extforge GPU end-to-end run ({state['started']})", ""]
    if state["facts"]:
        lines += ["## Facts", ""] + [f"- {k}: {v}" for k, v in state["facts"].items()] + [""]
    if state.get("phases"):
        lines += ["## Phases", ""] + [f"- {p['phase']}: {p['started']} to {p.get('ended', '(running)')}, "
                                      f"{p.get('outcome', 'unfinished')}" for p in state["phases"]] + [""]
    lines += ["## Steps", "", "| step | result | seconds |", "|---|---|---|"]
    lines += [f"| {st['name']} | {'ok' if st['ok'] else 'FAILED (exit %s)' % st['exit']} | {st['seconds']} |"
              for st in state["steps"]]
    failed = [st for st in state["steps"] if not st["ok"]]
    lines += ["", f"**{len(state['steps']) - len(failed)} of {len(state['steps'])} steps passed.**", ""]
    for st in failed:
        lines += [f"### {st['name']} (failed)", "", "```", st.get("tail", "")[-1200:], "```", ""]
    return "\n".join(lines)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Run:
    """Step records persisted in the work folder, so each phase adds to the same summary."""

    def __init__(self, work: Path, out: Path):
        self.work, self.out = work, out
        self.state_file = work / "state.json"
        self.state = load_state(self.state_file)

    def save(self) -> None:
        self.state_file.write_text(json.dumps(self.state, indent=2))
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.json").write_text(json.dumps(self.state, indent=2))
        (self.out / "summary.md").write_text(render_summary(self.state))

    def fact(self, key: str, value: object) -> None:
        self.state["facts"][key] = value
        self.save()

    def remember(self, options: Mapping[str, Any]) -> None:
        """What this phase was asked, for the phases after it (REMEMBERED keys)."""
        self.state["options"] |= {k: v for k, v in options.items() if k in REMEMBERED}
        self.save()

    def begin(self, phase: str) -> None:
        self.state["phases"].append({"phase": phase, "started": now()})
        self.save()

    def end(self, outcome: str) -> None:
        if self.state["phases"]:
            self.state["phases"][-1] |= {"ended": now(), "outcome": outcome}
        self.save()

    def step(self, name: str, cmd: list[str] | str, *, env: Mapping[str, str] | None = None, log: str | None = None,
             ok_codes: tuple[int, ...] = (0,), timeout: float | None = None,
             critical: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        """Run one step; a failed critical step ends the phase (what follows needs its result)."""
        print(f"\n== {name}\n$ {cmd if isinstance(cmd, str) else ' '.join(map(str, cmd))}", flush=True)
        t0 = time.monotonic()
        logf = self.work / "logs" / (log or re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".log")
        logf.parent.mkdir(parents=True, exist_ok=True)
        with logf.open("w") as fh:
            proc = subprocess.run(cmd, shell=isinstance(cmd, str), env=dict(env or os.environ), cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
            fh.write(proc.stdout)
        seconds = time.monotonic() - t0
        ok = proc.returncode in ok_codes
        tail = proc.stdout[-3000:]
        print(tail, flush=True)
        print(f"-- {name}: {'ok' if ok else 'FAILED'} (exit {proc.returncode}, {seconds:.1f} s)", flush=True)
        self.state["steps"].append({"name": name, "seconds": round(seconds, 1), "ok": ok,
                                    "exit": proc.returncode, "log": str(logf), "tail": tail[-1200:]})
        self.save()
        if critical and not ok:
            raise StepFailed(name)
        return proc

    def record(self, name: str, seconds: float, ok: bool, detail: str = "") -> None:
        self.state["steps"].append({"name": name, "seconds": round(seconds, 1), "ok": ok, "exit": 0 if ok else 1,
                                    "tail": detail})
        self.save()

    def has_step(self, name: str) -> bool:
        return any(st["name"] == name for st in self.state["steps"])

    def ok(self) -> bool:
        return all(st["ok"] for st in self.state["steps"])
