"""Cold fetch and packaging of the mirror's CUDA toolkits, per source.

    .venv/bin/python bench/toolkit_bench.py [--source 12.4:debian --source 13.0:wheels ...] [--no-record]

Runs in an empty extforge cache (a temporary folder): the download (apt for Debian, pip for
NVIDIA's wheels), the unpack into the toolkit layout, then every package of the set built with
rattler-build. Prints the numbers and appends a dated section to docs/benchmarks-history.md unless
--no-record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def measure(version: str, source: str) -> dict:
    from extforge.mirror import cuda_sources
    from extforge.mirror.builder import build_job
    from extforge.mirror.cuda_toolkit import Offer, toolkit_jobs
    from extforge.mirror.toolchain import detect

    start = time.monotonic()
    if source.startswith("host="):
        tk, fetch = cuda_sources.from_host(source.split("=", 1)[1]), {}
    else:
        tk = cuda_sources.fetch(Offer(version, source))
        fetch = json.loads((cuda_sources.toolkits_dir() / tk.identity / "toolkit.json").read_text())["fetch"]
    fetch_seconds = time.monotonic() - start
    packages = []
    start = time.monotonic()
    for job in toolkit_jobs(tk, detect().gxx):
        pkg = build_job(job)
        packages.append({"name": pkg.name, "bytes": pkg.path.stat().st_size, "seconds": round(pkg.seconds, 1)})
    return {
        "toolkit": tk.version, "source": source.split("=")[0], "origin": tk.origin,
        "fetch_seconds": round(fetch_seconds, 1), **fetch,
        "package_seconds": round(time.monotonic() - start, 1), "packages": packages,
        "package_bytes": sum(p["bytes"] for p in packages),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", action="append", metavar="VERSION:SOURCE",
                    help="e.g. 12.4:debian, 13.0:wheels, 13.0:host=/usr/local/cuda (default: the first two)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    sources = args.source or ["12.4:debian", "13.0:wheels"]
    results = []
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-", dir=os.environ.get("TMPDIR")) as cache:
        os.environ["EXTFORGE_CACHE"] = cache
        for item in sources:
            version, source = item.split(":", 1)
            results.append(measure(version, source))
            print(json.dumps(results[-1], indent=1), flush=True)
    if args.no_record:
        return
    from _record import append_section

    mib = lambda n: f"{n / 2**20:.0f}"  # noqa: E731
    lines = [
        f"## CUDA toolkits as packages, cold ({dt.date.today().isoformat()})", "",
        "Machine: development machine, 2 cores, 24 GiB, shared with other builds; an empty extforge cache; "
        "`bench/toolkit_bench.py`. Download: apt (Debian, private sources list) or pip (NVIDIA's wheels); "
        "unpack: only what the layout keeps; packaging: rattler-build, one package after the other.", "",
        "| toolkit | source | download MiB | download s | unpack s | packages MiB | packaging s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['toolkit']} | {r['source']} | {mib(r.get('download_bytes', 0))} | "
                     f"{r.get('download_seconds', '-')} | {r.get('unpack_seconds', '-')} | {mib(r['package_bytes'])} | "
                     f"{r['package_seconds']} |")
    lines += ["", "Package sizes (MiB): " + "; ".join(
        f"{r['toolkit']} {r['source']}: " + ", ".join(f"{p['name']} {p['bytes'] / 2**20:.1f}" for p in r["packages"])
        for r in results)]
    append_section(lines)


if __name__ == "__main__":
    main()
