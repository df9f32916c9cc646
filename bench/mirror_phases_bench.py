"""Where a mirror row's time goes, and the limit of the same bytes on the same machine.

    .venv/bin/python bench/mirror_phases_bench.py --cache DIR [--torch torch==2.14.1] [--no-record]

DIR is an extforge cache whose pip request folder for the row is already downloaded (copy or
hard-link the wheels of another cache); its mirror packages are removed first, so every package
is built. Phases: reading the inputs (pip skipped, the wheels hashed once), packaging each
package with rattler-build, placing and indexing the channel. The limit, on the same wheels:
unzip every wheel and write its files once, sha256 every file once, and one tar + zstd of the
files at the level the mirror uses and at a fast one, with every core. Prints the numbers and
the load average beside them; appends a dated section to docs/benchmarks-history.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _record import append_section  # noqa: E402

from extforge.machine import detect  # noqa: E402


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def unpack(wheels: list[Path], dest: Path) -> int:
    """Every member of every wheel written once (what the stage script does); bytes written."""
    total = 0
    for i, whl in enumerate(wheels):
        with zipfile.ZipFile(whl) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                out = dest / str(i) / info.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                total += info.file_size
    return total


def hash_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            h = hashlib.sha256()
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)


def compress(root: Path, out: Path, level: int, threads: int) -> int:
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level, threads=threads)
    with out.open("wb") as fh, cctx.stream_writer(fh) as zw, tarfile.open(fileobj=zw, mode="w|") as tf:
        tf.add(root, arcname=".")
    size = out.stat().st_size
    out.unlink()
    return size


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


Row = tuple[str, float, float, str]  # what, wall seconds, CPU seconds (this process, its threads and children), notes


def timed(what: str, fn, rows: list[Row], note: str = ""):  # type: ignore[no-untyped-def]
    """Wall and CPU seconds of fn(): on a shared machine the CPU seconds are what compares."""
    start, cpu = time.monotonic(), cpu_seconds()
    value = fn()
    rows.append((what, time.monotonic() - start, cpu_seconds() - cpu, f"{note}{'; ' if note else ''}{load()}"))
    show(rows[-1])
    return value


def show(row: Row) -> None:
    print(f"{row[0]:58s} {row[1]:7.1f} s wall {row[2]:7.1f} s CPU  {row[3]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, required=True, help="an extforge cache with the row's wheels downloaded")
    ap.add_argument("--torch", default="torch==2.14.1")
    ap.add_argument("--skip-limit", action="store_true", help="only the mirror's own phases")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()
    os.environ["EXTFORGE_CACHE"] = str(args.cache)
    os.environ.pop("RATTLER_CACHE_DIR", None)

    from extforge import mirror, paths
    from extforge.mirror.recipes import PackageJob

    default = Path.home() / ".cache" / "extforge"
    if args.cache.resolve() == default.resolve():
        raise SystemExit("refusing to empty the mirror packages of the default cache: pass a cache of your own")
    for sub in ("packages", "work"):
        shutil.rmtree(paths.own_area("mirror") / sub, ignore_errors=True)
    (paths.own_area("mirror") / "sha256-memo.json").unlink(missing_ok=True)

    rows: list[Row] = []
    reqs = mirror.pip_requirements(args.torch, [])
    inputs = timed("read inputs (wheels present: hash + metadata)", lambda: mirror.from_pip(reqs), rows)
    wheels = sorted(a.wheel for a in inputs.artifacts.values() if a.wheel is not None)
    wheel_bytes = sum(w.stat().st_size for w in wheels)

    work = Path(tempfile.mkdtemp(prefix="extforge-phases-"))
    times: dict[str, float] = {}

    def record(job: PackageJob, pkg) -> None:  # type: ignore[no-untyped-def]
        if pkg is not None:
            times[job.name] = pkg.seconds

    try:
        result = timed("mirror the row (package + place + index)", lambda: mirror.build_mirror(
            work / "channel", inputs, on_package=record), rows)
        wheel_names = {p.name for p in result.packages if p.name not in ("python", "python_abi")
                       and not p.name.startswith(("cuda-", "gcc", "gxx", "libstdcxx"))}
        conda_bytes = sum(p.path.stat().st_size for p in result.packages)
        wheel_pkgs = [n for n in times if n in wheel_names]
        # Packages are built in worker processes, whose CPU seconds reach this process only when
        # they exit: per package, wall seconds (summed over workers running at once) only.
        rows.append(("  packages' own wall seconds, summed", sum(times.values()), float("nan"),
                     f"{len(times)} packages, {conda_bytes / 2**30:.2f} GiB"))
        rows.append(("  of which the wheels' packages", sum(times[n] for n in wheel_pkgs), float("nan"),
                     f"{len(wheel_pkgs)} packages from {wheel_bytes / 2**30:.2f} GiB of wheels"))
        top = sorted(times.items(), key=lambda kv: -kv[1])[:5]
        print("slowest packages: " + ", ".join(f"{n} {s:.0f} s" for n, s in top))
        if not args.skip_limit:
            tree = work / "tree"
            written = timed("limit: unzip the wheels, write their files once", lambda: unpack(wheels, tree), rows)
            timed("limit: sha256 of every file once", lambda: hash_tree(tree), rows, f"{written / 2**30:.2f} GiB")
            cores = os.cpu_count() or 1
            for level, threads in ((3, 1), (3, cores), (1, cores), (-1, cores)):
                size = timed(f"limit: tar + zstd level {level}, {threads} thread(s)",
                             lambda lv=level, t=threads: compress(tree, work / "t.tar.zst", lv, t), rows)
                rows[-1] = (*rows[-1][:3], f"{size / 2**30:.2f} GiB; {rows[-1][3]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for row in rows:
        show(row)
    if not args.no_record:
        m = detect()
        append_section([
            f"\n## Mirror phases of one row ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)\n",
            f"Machine: {m.cores} cores, {m.memory_gib:.0f} GiB, local disk, shared with other work (load average "
            f"beside each number). `bench/mirror_phases_bench.py --torch {args.torch}`, wheels already downloaded.\n",
            "| phase | wall s | CPU s | notes |",
            "|---|---:|---:|---|",
            *(f"| {what} | {wall:.1f} | {cpu:.1f} | {note} |" for what, wall, cpu, note in rows),
        ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
