"""Processes for the channel reliability tests: `python procs.py publish CHANNEL PKG...` and
`python procs.py read CHANNEL STOPFILE` (reads and solves until STOPFILE exists, prints a JSON summary)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path


def channel_problems(channel: Path) -> tuple[list[str], set[str]]:
    """Problems a reader would hit now (unparseable repodata, listed files missing or partial),
    and the package names the repodata lists."""
    problems, listed = [], set()
    for sd in ("noarch", "linux-64"):
        path = channel / sd / "repodata.json"
        if not path.exists():
            continue
        try:
            repodata = json.loads(path.read_bytes())
        except ValueError as exc:
            problems.append(f"{sd}/repodata.json unparseable: {exc}")
            continue
        for fn, rec in {**repodata.get("packages", {}), **repodata.get("packages.conda", {})}.items():
            listed.add(rec["name"])
            try:
                data = (channel / sd / fn).read_bytes()
            except OSError as exc:
                problems.append(f"{sd}/{fn} listed but unreadable: {exc}")
                continue
            if hashlib.sha256(data).hexdigest() != rec["sha256"]:
                problems.append(f"{sd}/{fn} listed but its bytes differ (half-written?)")
    return problems, listed


def read(channel: Path, stop: Path) -> None:
    from rattler import solve

    reads = solves = 0
    problems: list[str] = []
    while not stop.exists():
        found, listed = channel_problems(channel)
        problems += found
        reads += 1
        if reads % 5 == 0 and listed:
            try:
                asyncio.run(solve([channel.as_uri()], sorted(listed)[-4:], platforms=["linux-64", "noarch"], virtual_packages=[]))
                solves += 1
            except Exception as exc:  # any solve failure during publishing is a finding
                problems.append(f"solve failed: {exc}")
        time.sleep(0.005)
    print(json.dumps({"reads": reads, "solves": solves, "problems": problems}))


def publish(channel: Path, packages: list[Path]) -> None:
    from extforge.publishing.publish import publish as do_publish

    # Tiny fixtures hold no ELF, which the extension audit rejects; the gate has its own test.
    result = do_publish(packages, channel, audit=False)
    print(json.dumps(result.to_json()))


if __name__ == "__main__":
    cmd, channel, *rest = sys.argv[1:]
    if cmd == "read":
        read(Path(channel), Path(rest[0]))
    else:
        publish(Path(channel), [Path(p) for p in rest])
