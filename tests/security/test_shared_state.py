"""What another user writes where extforge reads (a site's shared cost store, a split build's
output folder) is input, never code, and never a hang or a crash: each case is planted by a real
second user (tests/peers.py) and the real CLI or launcher runs as root on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extforge import shared_read
from extforge.building import parts
from extforge.building.build import part_environment
from extforge.building.parts import owner
from extforge.errors import ExtforgeError
from package_files import package_member

from .conftest import Result, assert_no_crash

SPLIT_DEMO = Path(__file__).resolve().parents[1] / "data" / "split-demo"
LAUNCHER = Path(__file__).resolve().parents[2] / "src" / "extforge" / "data" / "part-launcher.sh"


def _as(peer, *cmd: str, input: str | None = None) -> None:
    subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--", *cmd],
                   check=True, capture_output=True, text=True, cwd="/", input=input)


def _plant(peer, path: Path, text: str) -> None:
    _as(peer, "sh", "-c", 'cat > "$1"', "_", str(path), input=text)


def _extforge(*args: str, env: dict[str, str], timeout: float = 120, umask: int = 0o022) -> Result:
    proc = subprocess.run([sys.executable, "-m", "extforge", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300", **env}, preexec_fn=lambda: os.umask(umask))
    res = Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    assert_no_crash(res)
    return res


def _entry(**change: object) -> dict[str, object]:
    """A store entry as a real build writes it (causal-conv1d's, recipe/causal-conv1d/build-costs.json), changed."""
    entry: dict[str, object] = {
        "schema": 1, "recipe": "planted", "version": "1.0", "measured_at": "2026-11-27T12:25:15.713802+00:00",
        "host": "node1", "archs": ["90"], "jobs": 4, "nvcc_threads": 1, "compile_seconds": 355.1,
        "largest_process_bytes": 3451027456, "units": {"causal_conv1d": 38.6, "causal_conv1d_bwd": 355.1}}
    return entry | change


def _deep(depth: int) -> str:
    return json.dumps(_entry()).replace('"units": {', '"units": {"deep": ' + "[" * depth + "]" * depth + ', ', 1)


# Each as the issue found it on the old code: a crash ("failed unexpectedly", RecursionError), a
# plan of 0.0 GiB per job (every compile at once: out of memory), "needs ~-0.0 GiB", or a hang.
PLANTED = {
    "a 0-byte peak": json.dumps(_entry(largest_process_bytes=0)),
    "a negative peak": json.dumps(_entry(largest_process_bytes=-5)),
    "a 1-byte peak": json.dumps(_entry(largest_process_bytes=1)),
    "NaN seconds": json.dumps(_entry(units={"causal_conv1d": float("nan")})),
    "infinite seconds": json.dumps(_entry(units={"causal_conv1d": float("inf")})),
    "negative seconds": json.dumps(_entry(units={"causal_conv1d": -100.0})),
    "a list for seconds": json.dumps(_entry(units={"causal_conv1d": [1, 2]})),
    "no unit": json.dumps(_entry(units={})),
    "an empty run": json.dumps(_entry(runs=[[]])),
    "0 jobs": json.dumps(_entry(jobs=0)),
    "10000-deep JSON": _deep(10_000),
    "a unit name with shell metacharacters": json.dumps(_entry(units={"x\ta[$(id)]": 1.0})),
}


@pytest.mark.parametrize("case", list(PLANTED) + ["a FIFO", "a link to /dev/zero", "a 2 GiB file"])
def test_a_planted_cost_entry_is_one_warning_and_the_default_plan(peer_site, case: str) -> None:
    """The old code: "failed unexpectedly" (NaN, inf, lists, 0 jobs, no unit: ZeroDivisionError),
    RecursionError (deep JSON), 0.0 GiB per job and every core compiling (a 0- or 1-byte peak),
    "needs ~-0.0 GiB" (negative), the unit name carried into assignment.tsv, a hang (FIFO), memory
    filled (/dev/zero, 2 GiB)."""
    attacker = peer_site.peers[1]
    store = peer_site.root / f"store-{len(list(peer_site.root.glob('store-*')))}"
    store.mkdir()
    os.chown(store, 0, peer_site.gid)
    os.chmod(store, 0o2775)  # a site's store beside its channel: every build node's admin writes it
    _as(attacker, "mkdir", str(store / "planted"))
    entry = store / "planted" / "1.0.json"
    if case == "a FIFO":
        _as(attacker, "mkfifo", str(entry))
    elif case == "a link to /dev/zero":
        _as(attacker, "ln", "-s", "/dev/zero", str(entry))
    elif case == "a 2 GiB file":
        _as(attacker, "truncate", "-s", "2G", str(entry))
    else:
        _plant(attacker, entry, PLANTED[case])
    res = _extforge("plan", "--profile", "planted", "--cores", "64", "--memory", "64G", "--json",
                    env={"EXTFORGE_COST_STORE": str(store), "EXTFORGE_CACHE": str(peer_site.root / "root-cache")}, timeout=60)
    assert res.returncode == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"ignoring the build-cost entry {entry}: " in warnings[0], res.stderr
    plan = json.loads(res.stdout)["plan"]
    assert plan["numbers_from"].startswith("default estimate")
    # flash-attn's 4.4 GiB per compile: 13 jobs in the 57.6 GiB the planner leaves of 64 GiB.
    assert plan["max_jobs"] * plan["nvcc_threads"] < 64 and plan["predicted_peak_bytes"] > 4 * 2**30


def _build_split_demo(peer_site, name: str, ccache: str, plant, *args: str) -> tuple[Result, Path, Path]:
    """`extforge build` of the split-demo recipe as root, with a shared store where a member
    planted `<store>/split-demo/1.0.0.json` (`plant(attacker, entry)`); the result, the entry
    and the output folder."""
    if shutil.which("ninja") is None or shutil.which("gcc") is None:
        pytest.skip("ninja and gcc are needed")
    attacker = peer_site.peers[1]
    base = peer_site.root / name
    base.mkdir()
    store = peer_site.shared_folder(f"{name}-store")
    _as(attacker, "mkdir", str(store / "split-demo"))
    entry = store / "split-demo" / "1.0.0.json"
    plant(attacker, entry)
    channel = base / "channel"
    (channel / "noarch").mkdir(parents=True)
    recipe = base / "split-demo"
    shutil.copytree(SPLIT_DEMO, recipe)
    res = _extforge("build", str(recipe), "--channel", str(channel), "--output-dir", str(base / "out"), "--no-test",
                    "--no-audit", *args, timeout=120,
                    env={"EXTFORGE_COST_STORE": str(store), "EXTFORGE_CACHE": str(base / "cache"),
                         "PATH": f"{Path(ccache).parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    return res, entry, base / "out"


def test_a_unit_name_with_shell_metacharacters_never_reaches_the_split_launcher(peer_site, ccache: str) -> None:
    """A member of the store's group plants the split-demo recipe's costs with a unit whose name
    carries a tab and an arithmetic expression: the old code wrote it into assignment.tsv, and
    part-launcher.sh, evaluating the owner it read there, ran `touch MARKER` as root. Now the
    entry is one warning naming it, and the part builds by the units' hash."""
    marker = peer_site.root / "MARKER"
    planted = _entry(recipe="split-demo", version="1.0.0",
                     units={"alpha": 9.0, f"beta\ta[$(touch${{IFS}}{marker})]": 1.0, "gamma": 5.0, "delta": 4.0})
    res, entry, out = _build_split_demo(peer_site, "split", ccache,
                                        lambda attacker, entry: _plant(attacker, entry, json.dumps(planted)), "--part", "1/2")
    assert res.returncode == 0, res.output
    assert not marker.exists(), "a command read from the cost store ran"
    text = " ".join(res.stderr.split())
    assert f"ignoring the build-cost entry {entry}: unit 'beta\\ta[$(touch${{IFS}}" in text, res.stderr
    assert "part 1 of 2:" in res.output
    # No cost data left: every unit goes by its name's hash (the part's unit notes, kept beside its log).
    (units,) = (out / "logs").glob("*.units")
    assert sorted(line.split()[1] for line in units.read_text().splitlines() if line.startswith("compiled")) == \
        sorted(u for u in ("alpha", "beta", "gamma", "delta") if owner(u, 2) == 1)


def test_a_build_whose_cost_entry_is_a_fifo_builds_and_learns(peer_site, ccache: str) -> None:
    """The old code hung in the planner, before anything was built, reading the FIFO. Now: one
    warning, the default estimate, and the build's own costs replace the FIFO in the store."""
    res, entry, _ = _build_split_demo(peer_site, "fifo", ccache, lambda attacker, entry: _as(attacker, "mkfifo", str(entry)))
    assert res.returncode == 0, res.output
    assert res.stderr.count(f"ignoring the build-cost entry {entry}: it is not a regular file") == 1, res.stderr
    learned = json.loads(entry.read_text())
    assert {"alpha", "beta", "gamma", "delta"} <= set(learned["units"])


def test_the_launcher_never_evaluates_a_planted_assignment(peer_site, tmp_path: Path) -> None:
    """assignment.tsv lies in the output folder, which a group may write: a member replaces it
    with owners that are bash arithmetic. The old launcher ran `((owner != part))` on what awk
    read there and so ran `touch MARKER` as the building user (root)."""
    attacker = peer_site.peers[1]
    out = peer_site.shared_folder("launcher-out")
    marker = out / "MARKER"
    assignment = out / "assignment.tsv"
    _plant(attacker, assignment, f"alpha\ta[$(touch${{IFS}}{marker})]\nbeta\t$(touch${{IFS}}{marker})\ngamma\t1+1\n")
    state = tmp_path / "state"
    state.mkdir()
    for unit in ("alpha", "beta", "gamma"):
        subprocess.run(["bash", str(LAUNCHER), "1", "2", str(assignment), str(state), "", "true", "-c", f"{unit}.c",
                        "-o", str(tmp_path / f"{unit}.o")], check=True, capture_output=True, text=True)
    assert not marker.exists(), "the launcher ran a command read from assignment.tsv"
    notes = [line.split() for line in (state / "units").read_text().splitlines()]
    # Each unit was placed by its name's hash (an owner that is no part number is no owner).
    for words in notes:
        assert words[0] == "compiled" or int(words[2]) == owner(words[1], 2)
    assert sorted(w[1] for w in notes) == ["alpha", "beta", "gamma"]
    bad = subprocess.run(["bash", str(LAUNCHER), "a[$(touch${IFS}" + str(marker) + ")]", "2", str(assignment), str(state), "",
                          "true", "-c", "alpha.c", "-o", str(tmp_path / "alpha.o")], capture_output=True, text=True)
    assert bad.returncode == 2 and "are not part numbers" in bad.stderr and not marker.exists()


@pytest.mark.parametrize("value", ["1/9999999999999999999", ""])
def test_a_bad_part_is_one_line(sandbox, value: str) -> None:
    """The old code: OverflowError for a part count past an index ("failed unexpectedly"), and
    `--part ''` ignored (a whole build ran instead of a part)."""
    channel = sandbox.path("ch", "noarch")
    res = sandbox.run("build", str(SPLIT_DEMO), "--channel", str(channel.parent), "--part", value, expect=2)
    res.refused("--part")
    assert "is not I/N" in res.output and "failed unexpectedly" not in res.output


def test_a_split_builds_notes_are_read_only_from_its_own_private_folder(peer_site) -> None:
    """The notes a part leaves (which units it compiled, whether it reached its link) decide what
    extforge build reports and whether a failed part still counts. The old code made their folder
    in the output folder with mkdir -p (a member's folder or link taken as it was) and read any
    member's files there: a planted `units` made a failed part pass ("link x"), and a line
    `compiled alpha x y` crashed the report (ValueError)."""
    attacker = peer_site.peers[1]
    out = peer_site.shared_folder("notes-out")
    _as(attacker, "mkdir", "-m", "2777", str(out / "bld"))
    state = parts.state_dir(out / "bld")
    _as(attacker, "mkdir", "-m", "777", str(state))
    _plant(attacker, state / "units", "link libx.so\ncompiled alpha x y\n")
    env = {"EXTFORGE_COMPILER_LAUNCHER": "ccache"}
    with pytest.raises(ExtforgeError) as exc:
        part_environment(env, parts.Part(2, 1), "split-demo", None, {}, state)
    assert exc.value.what.startswith(f"refusing to use {state}: it is owned by uid {attacker.uid}")
    # The folder is the builder's own now; a file in it that is not (the folder swapped while
    # the part ran), or that others may write, is refused, never counted.
    shutil.rmtree(state)
    part_environment(env, parts.Part(2, 1), "split-demo", None, {}, state)
    assert oct(state.stat().st_mode & 0o777) == "0o700" and (state / parts.ASSIGNMENT_FILE).read_text() == ""
    parts.clear_notes(state)
    (state / "units").write_text("link libx.so\ncompiled alpha x y\ncompiled a[$(id)] 0 3\ncompiled beta 0 3\n")
    outcome = parts.read_outcome(state)
    assert (outcome.links, outcome.compiled, outcome.seconds) == (1, {"beta": 0}, {"beta": 3})
    os.chown(state / "units", attacker.uid, attacker.gid)
    with pytest.raises(shared_read.Refused, match=f"belongs to uid {attacker.uid}, not to you"):
        parts.part_reached_link(state)
    os.chown(state / "units", 0, 0)
    os.chmod(state / "units", 0o664)
    with pytest.raises(shared_read.Refused, match="others may write it"):
        parts.read_outcome(state)


def test_the_nvcc_wrapper_passes_only_a_number_of_parts_to_split_unit(tmp_path: Path) -> None:
    """EXTFORGE_SPLIT_UNITS reaches extforge-nvcc from the planner, which takes only checked units
    and counts from the store; the wrapper checks the count again before it passes it on. The old
    wrapper gave split_unit.py whatever followed `=`, and the compile died in a traceback."""
    layer = Path(parts.__file__).parents[1] / "data" / "torch-build"
    fake = tmp_path / "nvcc"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/called\n')
    fake.chmod(0o755)
    (tmp_path / "rewrites.log").touch()
    for value in ("conv=$(id)", "conv=2 x", "conv=0", "conv=99999"):
        (tmp_path / "called").unlink(missing_ok=True)
        proc = subprocess.run([str(layer / "extforge-nvcc"), "-c", "conv.cu", "-o", "conv.o"], cwd=tmp_path,
                              capture_output=True, text=True,
                              env={**os.environ, "EXTFORGE_LAYER_SHARE": str(layer), "EXTFORGE_REAL_NVCC": str(fake),
                                   "EXTFORGE_REWRITES_LOG": str(tmp_path / "rewrites.log"), "EXTFORGE_SPLIT_UNITS": value})
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "called").read_text().startswith("-c conv.cu -o conv.o")  # compiled whole
    assert "split:" not in (tmp_path / "rewrites.log").read_text()


def test_a_build_log_is_never_written_through_a_link_planted_in_a_shared_output_folder(peer_site, tmp_path: Path) -> None:
    """The build log's name is the recipe's and the second it starts (`logs/NAME-YYYYmmdd-HHMMSS.log`):
    a member of the output folder's group (2775) links the names of the next minutes to a file of
    root's. main opened the log with `open("w")` and truncated that file, writing the build's
    log into it. Now the log is created exclusively below the output folder, no link followed:
    exit 2 naming the link; root's file is as it was."""
    attacker = peer_site.peers[1]
    out = peer_site.shared_folder("log-out")
    victim = tmp_path / "precious.txt"
    victim.write_text("root's data\n")
    upstream = tmp_path / "upstream"
    for sub in ("noarch", "linux-64"):
        (upstream / sub).mkdir(parents=True)
        (upstream / sub / "repodata.json").write_text(json.dumps({"info": {"subdir": sub}, "packages": {}}))
    recipe = Path(__file__).resolve().parents[1] / "slurm" / "data" / "failing"
    _as(attacker, "mkdir", str(out / "logs"))
    start = time.time()
    _as(attacker, "sh", "-c", "for s in $(seq 0 300); do ln -s \"$1\" \"$2/failing-$(date -d @$(($3 + s)) +%Y%m%d-%H%M%S).log\"; done",
        "_", str(victim), str(out / "logs"), str(int(start)))
    res = _extforge("build", str(recipe), "--channel", upstream.as_uri(), "--output-dir", str(out), "--no-test",
                    "--no-audit", env={"EXTFORGE_CACHE": str(peer_site.root / "root-cache")}, timeout=240)
    assert time.time() - start < 300, "the build started after the planted names"
    assert victim.read_text() == "root's data\n"
    assert res.returncode == 2, res.output
    assert f"refusing to write {out}/logs/failing-" in res.stderr and "something is there already" in res.stderr


# split-demo with a pause between writing its build.ninja and running ninja, as a real build has
# (its configure step, minutes of compiles while later edges wait): time for a member to act.
SLOW_DEMO = (SPLIT_DEMO / "recipe.yaml").read_text().replace('      ninja -j "$MAX_JOBS"', '      sleep 3\n      ninja -j "$MAX_JOBS"')
UNITS = (b"f_alpha", b"f_beta", b"f_gamma", b"f_delta")


def _build_while(peer_site, name: str, attack: str, umask: int, plant=lambda attacker, out: None) -> tuple[Result, Path]:
    """`extforge build` of SLOW_DEMO as root into a group's output folder (2775) with `umask`,
    after a member planted what `plant(attacker, out)` does, while they run the shell loop
    `attack` ($1: the output folder) until the build ends; the result and the output folder."""
    if shutil.which("ninja") is None or shutil.which("gcc") is None:
        pytest.skip("ninja and gcc are needed")
    attacker = peer_site.peers[1]
    out = peer_site.shared_folder(f"{name}-out")
    plant(attacker, out)
    base = peer_site.root / name
    (base / "channel" / "noarch").mkdir(parents=True)
    (base / "split-demo").mkdir()
    (base / "split-demo" / "recipe.yaml").write_text(SLOW_DEMO)
    loop = subprocess.Popen(["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}", "--init-groups", "--inh-caps=-all",
                             "--", "sh", "-c", f"while :; do {attack}; sleep 0.05; done", "_", str(out)],
                            cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        res = _extforge("build", str(base / "split-demo"), "--channel", str(base / "channel"), "--output-dir", str(out),
                        "--no-test", "--no-audit", umask=umask, env={"EXTFORGE_CACHE": str(base / "cache")})
    finally:
        loop.kill()
        loop.wait()
    return res, out


def _built_from_the_builders_bytes(res: Result, out: Path) -> None:
    assert res.returncode == 0, res.output
    (package,) = (out / "noarch").glob("split-demo-*.conda")
    library = package_member(package, "lib/libsplit.so")
    assert all(unit in library for unit in UNITS) and b"f_planted" not in library


def test_a_member_rewriting_a_running_builds_work_tree_never_runs_code_as_the_builder(peer_site, tmp_path: Path) -> None:
    """Several admins build into one group output folder (2775), root with umask 002. A member
    loops over the folder appending a ninja edge that writes MARKER (in a folder only root can
    reach) to every build.ninja it can open, and a function of theirs to a C source. main
    ran rattler-build with the output folder as its own: its work tree under `OUT/bld/` was the
    group's to write (2775 folders, 664 files), so ninja ran the member's edge as root and
    their function went into root's package. Now rattler-build works in a folder of root's
    alone (0700, in root's cache): MARKER stays absent and the package holds root's units only."""
    marker = tmp_path / "MARKER"
    append_edge = (f"find \"$1\" -name build.ninja -writable | while read -r f; do grep -q planted \"$f\" || "
                   f"printf '\\nrule planted\\n  command = id -u > {marker}\\nbuild planted: planted\\n' >> \"$f\"; done; "
                   "find \"$1\" -name alpha.c -writable | while read -r f; do grep -q f_planted \"$f\" || "
                   "echo 'int f_planted(int x) { return x; }' >> \"$f\"; done")
    res, out = _build_while(peer_site, "rewrite", append_edge, umask=0o002)
    assert not marker.exists(), "a member's ninja edge ran as the builder"
    _built_from_the_builders_bytes(res, out)


def test_folders_a_member_made_first_in_the_output_folder_never_hold_the_build(peer_site, tmp_path: Path) -> None:
    """A member of the output folder's group (2775) makes the folders rattler-build makes under
    its output folder before root builds there (`bld/`, `src_cache/`, `test/`, `broken/`,
    `.tmp/`) and a link at its log `rattler-build-log.txt` to a file of root's; root builds with
    umask 022. main built in the member's `bld/`: they swapped root's running work folder for a
    copy of their own (the host prefix's header declaring a function of theirs), and root's
    package was built from it; rattler-build wrote its log through the link. Now none of these
    is used: root's file is as it was, the package holds root's units only."""
    victim = tmp_path / "precious.txt"
    victim.write_text("root's data\n")
    swap = ("for d in \"$1\"/bld/rattler-build_*; do case $d in *.old|*.mine) continue;; esac; "
            "[ -f \"$d/work/build.ninja\" ] || continue; cp -r \"$d\" \"$d.mine\" && "
            "for h in \"$d.mine\"/host_env_*/include/split_demo.h; do echo '__attribute__((weak)) int f_planted(int x) { return x; }' >> \"$h\"; done && "
            "mv \"$d\" \"$d.old\" && mv \"$d.mine\" \"$d\"; done")

    def precreate(attacker, out: Path) -> None:
        for name in ("bld", "src_cache", "test", "broken", ".tmp"):
            _as(attacker, "mkdir", "-m", "2777", str(out / name))
        _as(attacker, "ln", "-s", str(victim), str(out / "rattler-build-log.txt"))

    res, out = _build_while(peer_site, "precreated", swap, umask=0o022, plant=precreate)
    assert victim.read_text() == "root's data\n"
    _built_from_the_builders_bytes(res, out)
