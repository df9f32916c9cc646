"""Real processes on one channel folder: concurrent publishers and readers, SIGKILLed publishers."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from extforge.publishing.index import TEMP_PREFIX
from extforge.publishing.publish import LOG_NAME, logged_files, publish

from .procs import channel_problems

PROCS = Path(__file__).with_name("procs.py")
PUBLISHERS = 8
READERS = 3
KILLS = 8


def _spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PROCS), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_publishers_and_readers(tiny_packages, tmp_path):
    channel = tmp_path / "channel"
    stop = tmp_path / "stop"
    publish(tiny_packages.distinct[:1], channel, audit=False)  # readers start on a valid channel
    rest = tiny_packages.distinct[1:]
    batches = [rest[i::PUBLISHERS] for i in range(PUBLISHERS)]
    readers = [_spawn("read", channel, stop) for _ in range(READERS)]
    time.sleep(1.0)  # let the readers import rattler before the publishers start
    publishers = [_spawn("publish", channel, *batch) for batch in batches]
    for p in publishers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    stop.touch()
    summaries = []
    for r in readers:
        out, err = r.communicate(timeout=120)
        assert r.returncode == 0, err
        summaries.append(json.loads(out))

    repodata = json.loads((channel / "noarch" / "repodata.json").read_text())
    assert sorted(repodata["packages.conda"]) == sorted(p.name for p in tiny_packages.distinct)
    assert all(not s["problems"] for s in summaries), [s["problems"] for s in summaries]
    log = [json.loads(line) for line in (channel / LOG_NAME).read_text().splitlines()]
    assert sorted(e["file"] for e in log) == sorted(f"noarch/{p.name}" for p in tiny_packages.distinct)
    assert {"time", "user", "host", "file", "sha256", "audit"} <= set(log[0])
    assert not list(channel.rglob(f"{TEMP_PREFIX}tmp-*")) and not list(channel.glob(f"{TEMP_PREFIX}index-*"))
    reads = sum(s["reads"] for s in summaries)
    solves = sum(s["solves"] for s in summaries)
    assert reads > READERS and solves > 0  # the readers really overlapped the publishers
    print(f"\n{PUBLISHERS} publishers, {len(tiny_packages.distinct)} packages, {READERS} readers: "
          f"{reads} repodata reads, {solves} solves, 0 problems")


def test_sigkilled_publishers_leave_a_valid_channel(tiny_packages, tmp_path):
    channel = tmp_path / "channel"
    rng = random.Random(5)
    # One unkilled run measures how long a publisher process lives here; kills then land at
    # random points of that span (start-up, import, copy, index, log).
    began = time.monotonic()
    first = _spawn("publish", channel, tiny_packages.distinct[0])
    first.communicate()
    span = time.monotonic() - began
    killed = attempts = 0
    # Publishers that finish before their kill time are retried: run time varies with load.
    while killed < KILLS and attempts < 4 * KILLS:
        i = attempts % KILLS
        attempts += 1
        batch = tiny_packages.distinct[1 + 2 * i : 3 + 2 * i] or tiny_packages.distinct[-2:]
        p = _spawn("publish", channel, *batch)
        time.sleep(rng.uniform(0.3, 0.95) * span)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.communicate()
        problems, listed = channel_problems(channel)
        assert not problems, f"after attempt {attempts}: {problems}"
        served = {f"noarch/{p.name}" for p in tiny_packages.distinct if p.name.rsplit("-", 2)[0] in listed}
        assert served <= logged_files(channel), f"after attempt {attempts}: served without a log entry"
    leftovers_before = list(channel.rglob(f"{TEMP_PREFIX}tmp-*")) + list(channel.glob(f"{TEMP_PREFIX}index-*"))
    result = publish(tiny_packages.distinct, channel, audit=False)
    assert result.leftovers_removed == len(leftovers_before)
    on_disk = {f"noarch/{p.name}" for p in channel.joinpath("noarch").glob("*.conda")}
    assert on_disk == logged_files(channel), "the publish log and the channel disagree after the repairing publish"
    assert not list(channel.rglob(f"{TEMP_PREFIX}tmp-*")) and not list(channel.glob(f"{TEMP_PREFIX}index-*"))
    repodata = json.loads((channel / "noarch" / "repodata.json").read_text())
    assert sorted(repodata["packages.conda"]) == sorted(p.name for p in tiny_packages.distinct)
    assert not channel_problems(channel)[0]
    assert killed == KILLS, "publishers kept finishing before their kill; the test lost its teeth"
    print(f"\n{attempts} publishers started, {killed} SIGKILLed mid-run, {len(leftovers_before)} leftovers "
          f"cleaned and {len(result.log_repaired)} log entries repaired by the next publish, {len(tiny_packages.distinct)} packages present")
