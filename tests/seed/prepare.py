"""The seed rows' cold work, begun when the session starts and run beside the other tests.

Cold, the seed rows were 60% of the suite's wall, run at its end on an otherwise idle machine:
~12 GB of wheels downloaded (network), their mirror packages and four demo-ext builds (CPU);
meanwhile the earlier tests, one at a time, kept the 2 cores ~60% busy. This process does the
same work through the same functions (tests/seed/conftest.py; the wrong-ABI build too) at the lowest CPU priority, so it
takes the cores the tests leave idle and the network they do not use; the seed fixtures wait
for it and find the caches warm. Whatever it did not finish (it failed, or the session ended
first) the fixtures do again themselves, raising its errors there.

Run as `python -m seed.prepare FIXTURES_DIR REQUEST_JSON...` with tests/ on sys.path: each
REQUEST_JSON is a pip request (a JSON list of requirements) of the session's own fixtures,
downloaded first because those fixtures are needed first.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import SeedChannel

# What the rest of a full run writes under the temp dir (pyproject.toml's pytest settings).
SUITE_TMP_GIB = 16.0
# The channel this session's background made: its rows, as the seed_channel fixture returns them.
CHANNEL_RECORD = "seed-channel.session.json"
# The rows' lock it wrote, the envs then installed beside it (as far as it got).
LOCK_RECORD = "seed-lock.session.json"

_running: subprocess.Popen | None = None


def start(fixtures_dir: Path, first: list[list[str]]) -> None:
    """Begin the seed rows' work in a process of its own (its log: FIXTURES_DIR/seed-prepare.log)."""
    global _running
    if _running is not None:
        return
    for record in (CHANNEL_RECORD, LOCK_RECORD):
        (fixtures_dir / record).unlink(missing_ok=True)
    tests = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))}
    fixtures_dir.mkdir(parents=True, exist_ok=True)
    with (fixtures_dir / "seed-prepare.log").open("w") as log:
        _running = background([sys.executable, "-m", "seed.prepare", str(fixtures_dir), *(json.dumps(r) for r in first)],
                              log, env)


def background(command: list[str], log: IO[str], env: dict[str, str]) -> subprocess.Popen:
    """`command` at the lowest CPU priority, in a process group of its own (stopped as one) but
    in this session: with the kernel's autogroups (sched_autogroup_enabled, the default of most
    distributions) CPU is shared between sessions first, so a new session would weigh as much
    as the tests, nice or not (a cold run gave it a core of two, and the causal-conv1d build in the
    foreground ran on the other: 802 s)."""
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0,
                            preexec_fn=_lowest_priority)


def _lowest_priority() -> None:
    # The tests in the foreground keep their speed; this takes what they leave. A session that
    # dies without its finish hook takes this process with it (PR_SET_PDEATHSIG).
    os.nice(19)
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def wait() -> int | None:
    """Wait for the background work; its exit status, or None when none was started."""
    return _running.wait() if _running is not None else None


def made_channel(fixtures_dir: Path) -> SeedChannel | None:
    """The seed channel this session's background made, or None. Taken as it was made: mirrored
    again here, its index would read every package whose ctime moved since (the tests before
    link the same content-addressed packages into their installs: ~3 GB a row read again)."""
    from .conftest import SeedChannel

    record = fixtures_dir / CHANNEL_RECORD
    if _running is None or not record.is_file():
        return None
    data = json.loads(record.read_text())
    return SeedChannel(Path(data["path"]), data["rows"], data["skipped"], data["seconds"])


def made_lock(fixtures_dir: Path) -> Path | None:
    """The seed rows' lock this session's background wrote, or None."""
    record = fixtures_dir / LOCK_RECORD
    if _running is None or not record.is_file():
        return None
    return Path(json.loads(record.read_text())["lock"])


def stop() -> None:
    """End the background work with the session (its children too: pip, rattler-build's workers)."""
    if _running is not None and _running.poll() is None:
        os.killpg(_running.pid, signal.SIGTERM)
        _running.wait()


def main(fixtures_dir: Path, first: list[list[str]]) -> None:
    from extforge import mirror

    from .conftest import (
        CLUSTERS,
        install_row_env,
        make_seed_builds,
        make_seed_channel,
        make_seed_lock,
        make_wrong_abi_package,
        seed_shortfall,
    )

    # Begun before the other tests write their files, it leaves them their room; where the disk
    # cannot hold both, the seed fixtures decide at their turn, as they did without this process.
    shortfall = seed_shortfall(fixtures_dir, besides=SUITE_TMP_GIB)
    if shortfall:
        print(f"nothing prepared (the rest of the suite keeps {SUITE_TMP_GIB:.0f} GiB): {shortfall}")
        return
    # Seconds from this process's start, flushed as they come: the profile of a cold run reads
    # here how far the background had got when the seed tests began waiting for it.
    start = time.monotonic()
    for requirements in first:
        mirror.from_pip(requirements)
        print(f"{time.monotonic() - start:7.1f} s  downloaded {' '.join(requirements)}", flush=True)
    channel = make_seed_channel(fixtures_dir)
    made = {"path": str(channel.path), "rows": channel.rows, "skipped": channel.skipped, "seconds": channel.seconds}
    (fixtures_dir / CHANNEL_RECORD).write_text(json.dumps(made))
    rows = ", ".join(f"{name} {sec:.0f} s" for name, sec in channel.seconds.items())
    print(f"{time.monotonic() - start:7.1f} s  seed channel (rows mirrored: {rows})", flush=True)
    builds = make_seed_builds(channel, fixtures_dir)
    rows = ", ".join(f"{name} {sec:.0f} s" for name, sec in builds.seconds.items())
    print(f"{time.monotonic() - start:7.1f} s  seed builds ({rows})", flush=True)
    make_wrong_abi_package(channel, fixtures_dir)
    print(f"{time.monotonic() - start:7.1f} s  the wrong-ABI build", flush=True)
    # Each row's env installed ahead too (one install ~50-65 s warm): the row tests then check it.
    lock = make_seed_lock(channel, builds, fixtures_dir)
    if lock is None:
        return
    (fixtures_dir / LOCK_RECORD).write_text(json.dumps({"lock": str(lock)}))
    for c in CLUSTERS:
        if c.name in builds.packages:
            proc, _ = install_row_env(lock, c)
            done = "installed" if proc.returncode == 0 else f"not installed ({proc.stderr.strip()[-300:]})"
            print(f"{time.monotonic() - start:7.1f} s  row {c.name}'s env {done}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [json.loads(a) for a in sys.argv[2:]])
