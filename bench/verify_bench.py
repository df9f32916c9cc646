#!/usr/bin/env python3
"""How long `extforge verify` takes on an environment the size of a torch CUDA env.

Builds a synthetic prefix shaped like torch 2.14.1+cu130 with its nvidia-* libraries
(by default 5 GiB: a few libraries of 0.3-1 GiB, hundreds of MiB-sized ones, ~20,000
small Python files), the .conda packages it came from (in a channel folder) and conda-meta
records naming them, then times verify_prefix with its own empty cache: the first run (each
package archive fetched and sha256-checked, its paths.json made a trusted manifest, every file
hashed), --rehash (manifests known, every file hashed), with the files in the page cache, then
the default run that re-hashes only files changed since the last clean run (what a Slurm
prolog runs), and, with --cold as root, a full run with the page cache dropped.
Prints the numbers and appends a dated section to docs/benchmarks-history.md unless --no-record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from extforge.environment import verify as verify_mod
from extforge.environment.node import NodeFacts
from extforge.environment.receipt import Pinned, Receipt, write_receipt
from extforge.environment.verify import verify_prefix
from extforge.machine import detect

MIB = 1024**2


def shape(total: int) -> list[int]:
    """File sizes: 40% in four big libraries, 50% in 1-30 MiB libraries, the rest small files."""
    sizes = [int(total * f) for f in (0.16, 0.12, 0.07, 0.05)]
    mid = total * 0.5
    i = 0
    while mid > 0:
        s = (1 + (i * 7) % 30) * MIB
        sizes.append(s)
        mid -= s
        i += 1
    small = total - sum(sizes)
    n_small = 20000
    sizes += [max(1, small // n_small)] * n_small
    return sizes


def write_conda(dest: Path, name: str, root: Path, paths: list[dict]) -> Path:
    """A .conda of the files under root. Every file is a slice of one 64 MiB random block, so zstd
    with a 128 MiB long-distance window stores each block once: the packages of a 5 GiB prefix
    take well under 1 GiB of disk instead of another 5 GiB."""
    import io
    import tarfile
    import zipfile

    import zstandard

    def tar_to(zf: zipfile.ZipFile, member: str, add) -> None:
        with zf.open(member, "w", force_zip64=True) as raw:
            params = zstandard.ZstdCompressionParameters.from_level(1, window_log=27, enable_ldm=1, threads=-1)
            with zstandard.ZstdCompressor(compression_params=params).stream_writer(raw, closefd=False) as zw:
                with tarfile.open(fileobj=zw, mode="w|") as tar:
                    add(tar)

    def add_info(tar: tarfile.TarFile) -> None:
        index = {"name": name, "version": "1.0", "build": "0", "build_number": 0, "depends": [], "subdir": "linux-64"}
        for fn, obj in (("index.json", index), ("paths.json", {"paths_version": 1, "paths": paths})):
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(f"info/{fn}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    def add_pkg(tar: tarfile.TarFile) -> None:
        for p in paths:
            tar.add(root / p["_path"], arcname=p["_path"])

    path = dest / f"{name}-1.0-0.conda"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        tar_to(zf, f"info-{name}-1.0-0.tar.zst", add_info)
        tar_to(zf, f"pkg-{name}-1.0-0.tar.zst", add_pkg)
    return path


def build_prefix(root: Path, total: int, channel: Path) -> int:
    """The prefix, its packages in channel, and the install record `extforge install` would leave
    (verify without --lock believes nothing else); the bytes written."""
    block = os.urandom(64 * MIB)
    files_per_pkg = 2000
    records: dict[str, list[dict]] = {}
    written = 0
    for i, size in enumerate(shape(total)):
        pkg = f"pkg{i // files_per_pkg:02d}" if size < MIB else f"lib{i % 17:02d}"
        rel = f"lib/python3.11/site-packages/{pkg}/f{i}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with path.open("wb") as fh:
            left, off = size, i * 4096 % MIB
            while left:
                chunk = memoryview(block)[off : off + min(left, len(block) - off)]
                fh.write(chunk)
                h.update(chunk)
                left -= len(chunk)
                off = 0
        written += size
        records.setdefault(pkg, []).append({"_path": rel, "path_type": "hardlink", "sha256": h.hexdigest(), "size_in_bytes": size})
    (root / "conda-meta").mkdir()
    channel.mkdir(parents=True)
    pinned = []
    for name, paths in records.items():
        pkg = write_conda(channel, name, root, paths)
        data = pkg.read_bytes()
        rec = {"name": name, "version": "1.0", "build": "0", "fn": pkg.name, "url": pkg.as_uri(),
               "sha256": hashlib.sha256(data).hexdigest(), "files": [p["_path"] for p in paths],
               "paths_data": {"paths_version": 1, "paths": paths}}
        (root / "conda-meta" / f"{name}-1.0-0.json").write_text(json.dumps(rec))
        pinned.append(Pinned(name, "1.0", "0", rec["sha256"], hashlib.md5(data).hexdigest(), len(data), rec["url"], pkg.name))
    write_receipt(Receipt(str(root.resolve()), "synthetic", "default", pinned))
    return written


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=5.0, help="prefix size (default 5)")
    ap.add_argument("--dir", type=Path, help="where to build it (default: a temp dir on local disk)")
    ap.add_argument("--threads", type=int, help="hashing threads (default: verify's)")
    ap.add_argument("--cold", action="store_true", help="also time with the page cache dropped (root; slows everything else on the machine)")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-history.md")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="verify-bench-", dir=args.dir))
    # Its own cache: the first run must fetch and check every package, as on a fresh node.
    os.environ["EXTFORGE_CACHE"] = str(base / "cache")
    try:
        prefix = base / "env"
        t = time.monotonic()
        size = build_prefix(prefix, int(args.gib * 1024**3), base / "channel")
        print(f"built {size / 1024**3:.2f} GiB prefix in {time.monotonic() - t:.1f} s", file=sys.stderr)
        node = NodeFacts()  # admission is not what is measured
        # An installed env is older than its first verify: let the files leave the window in
        # which verify would not trust a snapshot of them (timestamps of the same tick).
        time.sleep(verify_mod.RACY_NS / 1e9 + 0.5)
        runs = []
        for label, rehash in (("first run: packages fetched and checked, every file hashed", True),
                              ("every file hashed (--rehash)", True),
                              ("unchanged since the last clean run (default)", False)):
            r = verify_prefix(prefix, node=node, threads=args.threads, rehash=rehash)
            assert r.ok, r.to_json()
            runs.append((label, r))
        if args.cold and drop_caches():
            runs.append(("every file hashed, page cache dropped", verify_prefix(prefix, node=node, threads=args.threads,
                                                                               rehash=True)))
        # A tampered byte must be found in the default mode, the one a prolog runs.
        victim = next((prefix / "lib").rglob("*.bin"))
        with victim.open("r+b") as fh:
            fh.seek(0)
            b = fh.read(1)
            fh.seek(0)
            fh.write(bytes([b[0] ^ 1]))
        assert not verify_prefix(prefix, node=node, threads=args.threads).ok
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows = [
        f"| {label} | {r.files_hashed} | {r.files_unchanged} | {r.bytes_hashed / 1024**3:.2f} | {r.seconds:.2f} |"
        for label, r in runs
    ]
    print("\n".join(rows))
    if not args.no_record:
        m = detect()
        lines = [
            f"\n## extforge verify on a torch-sized prefix ({dt.date.today().isoformat()})\n",
            f"Machine: {m.cores} cores, {m.memory_gib:.0f} GiB, {platform.machine()}, local disk; "
            f"load average {os.getloadavg()[0]:.1f} while measuring (shared machine); threads {args.threads or 'default'}. `bench/verify_bench.py --gib {args.gib}`: synthetic prefix shaped "
            "like torch + nvidia-* (four libraries holding 40% of the bytes, 1-30 MiB ones holding 50%, 20,000 small files), "
            "page cache warm unless said. File hashes come from the packages' own paths.json (each .conda, written by the bench, "
            "sha256-checked on the first run and kept as a trusted manifest in the user's private cache folder), not from "
            "conda-meta. The default mode re-hashes only files whose size, mtime, ctime or inode changed since "
            "the last clean run (a record kept HMAC-keyed in that folder), and still finds a flipped byte (asserted).\n",
            "| mode | files hashed | files unchanged | GiB hashed | seconds |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
        with (Path(__file__).resolve().parents[1] / "docs" / "benchmarks-history.md").open("a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
