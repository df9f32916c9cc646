#!/usr/bin/env python3
"""`extforge install` of a locked environment against uv and py-rattler's installer, cold and warm.

One run, the tools taking turns, each installing into fresh folders with a cache of its own on
the same file system (empty for the cold round, as the cold round left it for the warm ones):
- extforge: `extforge install ENV --lock LOCK --json` (the command, a process as uv's is), its
  phases and the number of files it hashed from the JSON;
- uv: `uv pip install --no-index --find-links WHEELS REQUIREMENT` into a fresh venv of the lock's
  Python: the same payload, from the pip wheels the mirror made the lock's packages of;
- py-rattler: `rattler.install` of the lock's records, their URLs pointed at the same local
  packages extforge installs from, in a process of its own (pixi's engine, as pixi links an
  environment). Its cold run extracts into a cache of its own, removed after it; its warm runs
  link from the package cache extforge's runs keep (the same extracted packages): the disk
  holds two extracted environments at most, not three (~5 GB each for torch);
- the wheel path: a venv (`python -m venv`) that uv fills from a pylock.toml of the same wheels
  (`uv pip sync --require-hashes`, uv's cache warm), then `extforge verify VENV --lock
  pylock.toml` twice: the first run hashes every file, the second trusts what the first checked.
Each prefix is removed and the file system synced between runs, untimed. extforge runs
byte-compiled, as a pip install leaves it (its modules are compiled once before the
rounds: where PYTHONDONTWRITEBYTECODE is set, every run compiled them again, ~0.1 s of each).
Prints a row per install and the warm medians' ratios; appends a dated section to
docs/benchmarks-history.md unless --no-record. --caches keeps the tools' caches in a folder
between runs (hard links of warm caches elsewhere cost no disk); --warm-only then skips the cold
round, where the disk has no room for three more extracted copies of the payload.

    bench/install_bench.py pixi.lock ENV --wheels DIR --python PY [--requirement torch==2.14.1]
                           [--channel-map NAME=URL] [--runs 3] [--work DIR] [--caches DIR [--warm-only]]
                           [--no-wheel-path]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _record import record_table, show

from extforge.environment.mirrors import site_mirrors
from extforge.environment.packages import locked_records

# py-rattler alone, as pixi installs a locked environment: the lock read, the records' URLs
# pointed at local packages, the environment linked from the package cache.
RATTLER = """
import asyncio, json, os, sys
from rattler import LockFile, install
lock, env, prefix, cache, urls = sys.argv[1:6]
environment = LockFile.from_path(lock).environment(env)
platform = next(p for p in environment.platforms() if p.name == "linux-64")
records = environment.conda_repodata_records_for_platform(platform)
local = json.loads(open(urls).read())
for r in records:
    r.url = local[r.file_name]
asyncio.run(install(records, prefix, cache_dir=cache, show_progress=False, execute_link_scripts=False))
os._exit(0)  # py-rattler's threads abort the interpreter's exit (extforge's CLI ends the same way)
"""


def removed(path: Path) -> None:
    """Remove a run's prefix and sync, untimed: the journal of 25,000 removals otherwise lands on
    the next tool's run (measured: every tool 0.9 s to 1.4 s over 11 rounds, flat with the sync)."""
    shutil.rmtree(path)
    os.sync()


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}… failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return seconds, proc.stdout


class Tools:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.caches = args.caches or work
        self.uv = shutil.which("uv", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}") or "uv"
        mirrors = site_mirrors(args.lock.parent, None, args.channel_map)
        self.urls = work / "urls.json"
        self.urls.write_text(json.dumps({r.file_name: mirrors.redirect(r.url) for r in locked_records(args.lock, args.env)}))
        # Everything under the bench's own cache root, rattler's package cache too.
        self.extforge_env = {k: v for k, v in os.environ.items() if k != "RATTLER_CACHE_DIR"}
        self.extforge_env["EXTFORGE_CACHE"] = str(self.caches / "extforge-cache")
        self.uv_env = {**os.environ, "UV_CACHE_DIR": str(self.caches / "uv-cache")}
        self.pylock = work / "pylock.toml"
        if args.no_wheel_path:
            return
        subprocess.run([self.uv, "pip", "compile", "-q", "--no-config", "--no-index", "--find-links", str(args.wheels),
                        "--python", args.python, "--format", "pylock.toml", "-o", str(self.pylock), "-"],
                       input=args.requirement, text=True, check=True, env=self.uv_env)

    def extforge(self, name: str, cold: bool) -> tuple[float, str]:
        cmd = [sys.executable, "-m", "extforge", "install", self.args.env, "--prefix", str(self.work / name),
               "--lock", str(self.args.lock), "--json", *(f"--channel-map={m}" for m in self.args.channel_map)]
        seconds, out = timed(cmd, self.extforge_env)
        result = json.loads(out)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in sorted(result["timings"].items()))
        return seconds, (f"{result['files_hashed']} files hashed, {result['archives_checked']} archives checked, "
                         f"{result.get('modules_checked', '?')} modules checked; {phases}")

    def uv_install(self, name: str, cold: bool) -> tuple[float, str]:
        venv = self.work / name
        subprocess.run([self.uv, "venv", "-q", "--python", self.args.python, str(venv)], check=True)
        seconds, _ = timed([self.uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-index",
                            "--find-links", str(self.args.wheels), self.args.requirement], self.uv_env)
        return seconds, f"uv pip install {self.args.requirement} (link mode: hardlink)"

    def venv(self, name: str) -> list[tuple[str, float, str]]:
        """A venv from the pylock.toml by uv, then extforge's verify of it, twice. The venv is
        Python's own (`python -m venv`): verify knows its files, not the extra ones `uv venv`
        writes (activate.bat, activate_this.py, .gitignore), which it names as unowned."""
        venv = self.work / name
        subprocess.run([self.args.python, "-m", "venv", "--without-pip", str(venv)], check=True)
        seconds, _ = timed([self.uv, "pip", "sync", "-q", "--no-config", "--offline", "--require-hashes", "--python",
                            str(venv / "bin" / "python"), str(self.pylock)], self.uv_env)
        rows = [("uv pylock", seconds, "uv pip sync --require-hashes pylock.toml (link mode: hardlink)")]
        for run in ("first", "second"):
            seconds, out = timed([sys.executable, "-m", "extforge", "verify", str(venv), "--lock", str(self.pylock), "--json"],
                                 self.extforge_env)
            report = json.loads(out)
            rows.append((f"verify venv, {run}", seconds, f"{report['files_hashed']} files hashed, "
                         f"{report['files_unchanged_since_snapshot']} unchanged since verified; ok {report['ok']}"))
        return rows

    def rattler(self, name: str, cold: bool) -> tuple[float, str]:
        cache = self.work / "rattler-cache" if cold else self.caches / "extforge-cache" / "rattler" / "pkgs"
        seconds, _ = timed([sys.executable, "-c", RATTLER, str(self.args.lock), self.args.env, str(self.work / name),
                            str(cache), str(self.urls)])
        if cold:
            shutil.rmtree(cache)
        source = "an empty cache" if cold else "extforge's package cache"
        return seconds, f"rattler.install of the lock's records, from {source}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=Path)
    ap.add_argument("env")
    ap.add_argument("--wheels", type=Path, required=True, help="the pip wheels of the same payload (uv's --find-links)")
    ap.add_argument("--python", required=True, help="the Python uv makes its venvs with (the lock's X.Y)")
    ap.add_argument("--requirement", default="torch==2.14.1")
    ap.add_argument("--channel-map", action="append", default=[])
    ap.add_argument("--runs", type=int, default=3, help="warm installs per tool")
    ap.add_argument("--work", type=Path, default=None, help="where the caches and prefixes go (one file system)")
    ap.add_argument("--caches", type=Path, default=None,
                    help="keep each tool's cache here between runs (extforge-cache/, uv-cache/), not in the work folder")
    ap.add_argument("--warm-only", action="store_true", help="no cold round: the caches in --caches are warm already")
    ap.add_argument("--no-wheel-path", action="store_true",
                    help="no venv from a pylock.toml (its hashes made uv copy the wheels into a cache keyed by another path)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.warm_only and not args.caches:
        ap.error("--warm-only needs --caches (warm ones)")
    args.lock = args.lock.resolve()
    rows: list[str] = []
    warm: dict[str, list[float]] = {"extforge": [], "uv": [], "py-rattler": []}
    venv: dict[str, list[float]] = {}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "src" / "extforge")],
                   check=True)
    with tempfile.TemporaryDirectory(prefix="install-bench-", dir=args.work) as tmp:
        tools = Tools(args, Path(tmp))
        runs = {"extforge": tools.extforge, "py-rattler": tools.rattler, "uv": tools.uv_install}
        for i in range(1 if args.warm_only else 0, args.runs + 1):
            state = "cold" if i == 0 else "warm"
            for tool, run in runs.items():
                name = f"{tool}-{i}"
                seconds, detail = run(name, i == 0)
                if i:
                    warm[tool].append(seconds)
                show(rows, f"| {i} | {tool} | {state} | {seconds:.2f} s | {detail} |")
                removed(Path(tmp) / name)
            if i and not args.no_wheel_path:
                for tool, seconds, detail in tools.venv(f"venv-{i}"):
                    venv.setdefault(tool, []).append(seconds)
                    show(rows, f"| {i} | {tool} | warm | {seconds:.2f} s | {detail} |")
                removed(Path(tmp) / f"venv-{i}")
    median = {tool: statistics.median(times) for tool, times in (warm | venv).items()}
    ratios = (f"warm medians: extforge {median['extforge']:.2f} s, uv {median['uv']:.2f} s, py-rattler "
              f"{median['py-rattler']:.2f} s; extforge / uv {median['extforge'] / median['uv']:.2f}, "
              f"extforge / py-rattler {median['extforge'] / median['py-rattler']:.2f}")
    if venv:
        ratios += (f"; the wheel path: uv from the pylock {median['uv pylock']:.2f} s, extforge's verify of that venv "
                   f"{median['verify venv, first']:.2f} s first, {median['verify venv, second']:.2f} s second")
    print(ratios)
    if not args.no_record:
        records = locked_records(args.lock, args.env)
        rounds = "each tool's cache warm from earlier runs (--warm-only)" if args.warm_only else \
            "each tool's cache empty for run 0, as run 0 left it after"
        record_table("`extforge install` against uv and py-rattler, cold and warm", "install_bench.py",
                     f"lock {args.lock.name}, env {args.env} ({len(records)} packages); uv: {args.requirement} from "
                     f"the same payload's pip wheels; {rounds}. {ratios}.",
                     ["run", "tool", "state", "seconds", "detail"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
