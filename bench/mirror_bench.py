"""Measure the foundation pipeline: cold mirror, warm mirror, demo-ext build, demo-ext install.

    .venv/bin/python bench/mirror_bench.py [--cache DIR] [--no-record]

Cold means an empty extforge cache (a fresh --cache folder, the default): pip's download of the
wheels from the local index, every package built with rattler-build. Warm is the same command
again. Prints the numbers and appends a dated section to docs/benchmarks-history.md unless --no-record.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from extforge.machine import detect  # noqa: E402


def timed_cli(env: dict[str, str], *args: str) -> tuple[float, dict]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "extforge", *args, "--json"], env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"extforge {args[0]} failed")
    return seconds, json.loads(proc.stdout)


def install(channels: list[str], prefix: Path, cache: Path) -> int:
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version, solve
    from rattler import install as rattler_install

    virtual = [
        GenericVirtualPackage(PackageName(n), Version(v), BuildString("0"))
        for n, v in (("__unix", "0"), ("__linux", "5.15"), ("__glibc", "2.36"), ("__cuda", "13.0"))
    ]

    async def run() -> int:
        records = await solve(channels, ["demo-ext"], platforms=["linux-64", "noarch"], virtual_packages=virtual)
        await rattler_install(records, target_prefix=prefix, cache_dir=cache, show_progress=False)
        return len(records)

    return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, help="extforge cache to use (default: a fresh temporary one)")
    ap.add_argument("--torch", default="torch==2.14.1")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()

    cache = args.cache or Path(tempfile.mkdtemp(prefix="extforge-bench-"))
    work = Path(tempfile.mkdtemp(prefix="extforge-bench-work-"))
    env = {**os.environ, "EXTFORGE_CACHE": str(cache), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("RATTLER_CACHE_DIR", None)
    channel = work / "mirror"
    try:
        mirror_args = ("mirror", "--channel", str(channel), "--from-pip", "--torch", args.torch)
        cold, summary = timed_cli(env, *mirror_args)
        warm, warm_summary = timed_cli(env, *mirror_args)
        build_s, built = timed_cli(
            env, "build", str(REPO / "recipe" / "demo-ext"), "--channel", str(channel), "--output-dir", str(work / "out")
        )
        start = time.monotonic()
        n = install([(work / "out").as_uri(), channel.as_uri()], work / "env", cache / "rattler")
        install_s = time.monotonic() - start
        start = time.monotonic()
        subprocess.run([str(work / "env" / "bin" / "python"), "-c", "import demo_ext"], check=True)
        import_s = time.monotonic() - start
        size_mib = sum(Path(p["file"]).stat().st_size for p in summary["packages"]) / 2**20
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)

    rows = [
        ("cold mirror (pip download + every package built)", cold, f"{len(summary['packages'])} packages, {size_mib:.0f} MiB"),
        ("warm mirror (same inputs, all cached)", warm, f"{warm_summary['cached']} cached, {warm_summary['built']} built"),
        ("demo-ext build (one .cu, sm_90, tests + audit)", build_s, built["packages"][0]["build_string"]),
        ("demo-ext solve + install into a fresh prefix", install_s, f"{n} packages"),
        ("`import demo_ext` in that prefix", import_s, ""),
    ]
    for what, seconds, note in rows:
        print(f"{what:55s} {seconds:8.1f} s  {note}")
    if not args.no_record:
        m = detect()
        lines = [
            f"\n## Mirror, demo-ext build and install ({dt.date.today().isoformat()})\n",
            f"Machine: {m.cores} cores, {m.memory_gib:.0f} GiB, {platform.machine()}, no GPU, local disk, "
            f"shared with other work. `bench/mirror_bench.py --torch {args.torch}` "
            f"({'cache ' + str(args.cache) if args.cache else 'fresh empty cache'}).\n",
            "| step | seconds | notes |",
            "|---|---:|---|",
            *(f"| {what} | {seconds:.1f} | {note} |" for what, seconds, note in rows),
        ]
        with (REPO / "docs" / "benchmarks-history.md").open("a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
