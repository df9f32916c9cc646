"""What `extforge build` shows while a build compiles, replayed: a real demo-ext build's log
(tests/data/build-logs, as rattler-build's log callback passed it) and a build of torch-scatter's
shape (setuptools runs one ninja per extension, 1-3 units each, from the unit seconds of a
node build: bench/data/2026-11-27-run-z-torch-scatter-2.1.2-ninja.costs.json), fed line by line
to the build's progress reports on a clock of the replay's own, with ninja's log and torch's
build.ninja written into the work folder as the build wrote them, and shown through the
console line `extforge build` uses, as plain lines (no terminal)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from extforge import ui
from extforge.building.build import Planned, progress_reports
from extforge.engine import LogSink
from extforge.planning import cost_store, plan

DATA = Path(__file__).resolve().parents[1] / "data" / "build-logs"
DEMO_RECIPE = Path(__file__).resolve().parents[2] / "recipe" / "demo-ext"
T0 = 1_800_000_000.0


@dataclass
class Clock:
    now: float = T0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(time, "time", lambda: self.now)
        monkeypatch.setattr(time, "monotonic", lambda: self.now)


@dataclass(frozen=True)
class Event:
    at: float  # seconds after the build started
    line: str | None = None  # a log line from rattler-build's callback ("info: ...")
    edge: str | None = None  # a line ninja appends to .ninja_log
    build_ninja: str | None = None  # torch writes build.ninja before a ninja run


def replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[Event], planned: Planned,
           quiet: bool = False) -> tuple[list[plan.BuildProgress], list[tuple[float, str]]]:
    """The reports of a build whose log and files went as `events` say, and the console's lines
    (with the replay's time of each)."""
    clock = Clock()
    clock.install(monkeypatch)
    shown: list[tuple[float, str]] = []
    monkeypatch.setattr(ui.console, "print", lambda message, **_: shown.append((clock.now - T0, message)))
    temp = tmp_path / "out" / "bld" / "rattler-build_x_1" / "work" / "build" / "temp.linux-x86_64-cpython-311"
    tmp_path.mkdir(exist_ok=True)
    reports: list[plan.BuildProgress] = []
    with (tmp_path / "build.log").open("w") as fh, ui.LiveLine("rattler-build", quiet=quiet) as live:
        sink = LogSink(fh, lambda m: live.show(m, key=m))

        def report(p: plan.BuildProgress) -> None:
            reports.append(p)
            live.show(p.describe(), key=p.run)

        with progress_reports(sink, tmp_path / "out" / "bld", set(), planned, report):
            for e in events:
                clock.now = T0 + e.at
                for name, text in ((".ninja_log", e.edge), ("build.ninja", e.build_ninja)):
                    if text is not None:
                        temp.mkdir(parents=True, exist_ok=True)
                        path = temp / name
                        header = "# ninja log v7\n" if name == ".ninja_log" and not path.exists() else ""
                        with path.open("a" if name == ".ninja_log" else "w") as out:
                            out.write(header + text)
                        os.utime(path, (clock.now, clock.now))
                if e.line is not None:
                    level, message = e.line.split(": ", 1) if ": " in e.line else ("info", e.line)
                    sink.on_log(SimpleNamespace(level=level, message=message))
    return reports, shown


def demo_events() -> list[Event]:
    """The real demo-ext build: one line of its log every 0.5 s; ninja writes a unit's log line as
    it ends, then prints its `[k/2]` (the units in the order they ended)."""
    edges = sorted(DATA.joinpath("demo-ext.ninja_log").read_text().splitlines()[1:], key=lambda e: int(e.split("\t")[1]))
    events, at = [], 0.0
    for line in DATA.joinpath("demo-ext.log").read_text().splitlines():
        if line.startswith("#"):
            continue
        at += 0.5
        if m := re.match(r"info:\s*\[(\d+)/2\]", line):
            if m[1] == "1":
                events.append(Event(at - 0.4, build_ninja="# written by torch\n"))
            events.append(Event(at - 0.1, edge=edges[int(m[1]) - 1] + "\n"))
        events.append(Event(at, line=line))
    return events


def test_a_real_demo_ext_build_shows_its_units_and_time_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old code reported progress only for recipes with per-unit costs, and its screen showed
    nothing where stderr is no terminal; here each unit shows, with the time the plan leaves. The
    plan comes from the costs the recipe folder ships, as in `extforge build`."""
    with cost_store.recipe_costs(DEMO_RECIPE):
        reports, shown = replay(tmp_path, monkeypatch, demo_events(), Planned("demo-ext", {"cuda_archs": ["9.0"]}))
    lines = [m for _, m in shown]
    # Its two units end 0.13 s apart: the first report, at most 10 s after the last, sees both.
    assert {(r.done, r.total) for r in reports} == {(2, 2)}
    assert re.fullmatch(r"compiling: units 2/2, ~\d+ s left", lines[0]) and lines[-1] == "compiling: units 2/2, finishing"
    assert "== " + lines[0] in (tmp_path / "build.log").read_text()
    assert replay(tmp_path / "quiet", monkeypatch, demo_events(), Planned("demo-ext", {"cuda_archs": ["9.0"]}),
                  quiet=True)[1] == []  # --json: nothing on the console


# torch-scatter 2.1.2's units on a 16-core node (run Z), compiled by one ninja run per extension.
SCATTER = cost_store.from_json(
    __import__("json").loads((Path(__file__).resolve().parents[2] / "bench" / "data" /
                              "2026-11-27-run-z-torch-scatter-2.1.2-ninja.costs.json").read_text()), Path()).units
CUDA_ONLY_RUNS = [("scatter", "scatter_cpu", "scatter_cuda"), ("segment_coo", "segment_coo_cpu", "segment_coo_cuda"),
                  ("segment_csr", "segment_csr_cpu", "segment_csr_cuda"), ("version",)]


def pyg_events(speed: float = 1.0, link: float = 8.0) -> Iterator[Event]:
    """A build of 4 extensions (FORCE_ONLY_CUDA): each a ninja run of its 1-3 units at once, then
    setuptools links it; every unit at `speed` times its measured seconds."""
    at = 5.0
    wall = int(T0 * 10**9)
    for run in CUDA_ONLY_RUNS:
        yield Event(at, line=f"info: building 'torch_scatter._{run[0]}_cuda' extension")
        yield Event(at + 0.1, build_ninja=f"# {run}\n")
        ends = sorted((SCATTER[u] * speed, u) for u in run)
        for k, (seconds, unit) in enumerate(ends, 1):
            start_ns = wall + round((at + 0.2) * 10**9)
            yield Event(at + 0.2 + seconds, edge=f"0\t{round(seconds * 1000)}\t{start_ns}\tcsrc/{unit}.o\t{unit}\n")
            yield Event(at + 0.2 + seconds, line=f"info:   [{k}/{len(run)}] c++ -c csrc/{unit}.cpp -o csrc/{unit}.o")
        at += 0.2 + ends[-1][0]
        yield Event(at + 0.1, line=f"info: g++ -shared csrc/{run[0]}.o -o build/lib/torch_scatter/_{run[0]}_cuda.so")
        at += link
    # The compile is over: the package step's lines follow for a while.
    for i in range(30):
        yield Event(at + 2 * i, line=f"info: Post-processing {i}")


def every_second(events: Iterator[Event]) -> list[Event]:
    """The events with a log line every second between them (compiler warnings, pip's chatter):
    rattler-build calls back only as lines come, and a report runs from there."""
    out: list[Event] = []
    for e in events:
        t = out[-1].at if out else 0.0
        while t + 1 < e.at:
            t += 1
            out.append(Event(t, line="info: ..."))
        out.append(e)
    return out


def test_a_pyg_shaped_build_shows_its_ninja_run_of_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-scatter's shape. Its first build (the default estimate over the 10 units its sdist's
    setup.py globs) says the ninja run, the units done of 10 and the time left; its second, planned
    from what the first taught the cost store, `ninja run 2 of 4, units 5/10, ~... left`. As
    plain lines: one when a run starts, else at most one every 30 s. The old code showed nothing."""
    first, shown = replay(tmp_path / "1", monkeypatch, every_second(pyg_events()), Planned("torch-scatter", {"cuda_archs": ["9.0"]}, "2.1.2", 10))
    assert sorted({r.run for r in first}) == [1, 2, 3, 4] and {r.total for r in first} == {10}
    assert [(r.run, r.done) for r in first] == sorted((r.run, r.done) for r in first)
    assert any(re.fullmatch(r"compiling: ninja run 2, units 3/10, ~\d+ (min \d+ )?s left", m) for _, m in shown), shown
    assert first[-1].done == 10 and first[-1].remaining_seconds == 0 and shown[-1][1] == "compiling: ninja run 4, units 10/10, finishing"
    for (t0, a), (t1, b) in zip(shown, shown[1:]):
        assert t1 - t0 >= 30 or a.split(",")[0] != b.split(",")[0], (a, b)
    log = next((tmp_path / "1").rglob(".ninja_log")).read_text()
    cost_store.save(cost_store.measure("torch-scatter", "2.1.2", log, ("90",), 1, None))

    second, shown = replay(tmp_path / "2", monkeypatch, every_second(pyg_events(speed=1.2)),
                           Planned("torch-scatter", {"cuda_archs": ["9.0"]}, "2.1.2", 10))
    lines = [m for _, m in shown]
    assert any(re.fullmatch(r"compiling: ninja run 2 of 4, units 5/10, ~\d+ (min \d+ )?s left .*", m) for m in lines), lines
    assert "compiling: ninja run 4 of 4, units 10/10, finishing (this machine: 1.20x the planner's unit costs)" in lines
