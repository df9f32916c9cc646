"""`scripts/gpu-e2e PHASE [options]`: the options, what later phases take from `start`, and the
phase dispatch."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from . import __doc__ as DOC
from .carry import prepare as prepare_carry
from .phases import Options, bundle_results, phase_finish, phase_rebuild, phase_start, phase_wait, symbols_only
from .state import PHASES, REMEMBERED, REPO, Run, StepFailed, merged_options
from .wheels import phase_wheels

# Flash-attn's host/run deps and what tests/gpu uses: the distributions of the node's environment
# that the runtime env needs besides torch's closure.
DEFAULT_EXTRAS = "einops,psutil,packaging,transformers,pytest"


def defaults() -> dict[str, Any]:
    """The defaults of the REMEMBERED options: their parser default is None, so that a later
    phase can tell an option given again from one left out."""
    return {"python": shutil.which("python3") or sys.executable, "archs": "90", "head_dims": "",
            "no_flash_attn": False, "fa3": False, "fa3_head_dims": "128", "fa3_dtypes": "bf16;fp16",
            "fa3_features": "bwd;varlen", "fa3_parts": 1, "side_by_side": False, "extras": DEFAULT_EXTRAS,
            "cuda_home": os.environ.get("CUDA_HOME") or "/usr/local/cuda"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(DOC or "").split("\n\n")[0])
    ap.add_argument("phase", choices=PHASES)
    ap.add_argument("--so", type=Path, help="symbols: the extension module to bring back without GPU code")
    ap.add_argument("--python-version", default="3.12", help="carry: the node python's minor (default 3.12)")
    ap.add_argument("--sources", type=Path, action="append", default=[], metavar="DIR",
                    help="carry: a folder holding the source archives no index serves (recipe/flash-attn-3's); repeatable")
    ap.add_argument("--work", type=Path, default=Path("/tmp/extforge-e2e"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/extforge-e2e/out")))
    ap.add_argument("--budget", type=float, default=520, help="seconds this command waits for background builds, all of them together")
    ap.add_argument("--rebuild", action="store_true", help="finish: also start the warm compile-cache rebuild")
    ap.add_argument("--manifest", type=Path, default=REPO / "envs" / "gpu-node" / "pixi.toml")
    ap.add_argument("--env", default="runtime", help="environment of --manifest to lock and install")
    ap.add_argument("--concurrent", action="store_true",
                    help="start --side-by-side: both builds at once, each pinned to half the node's cores")
    ap.add_argument("--warm-cache", action="store_true",
                    help="start --side-by-side: build demo-ext first, so the recipe's envs come from a warm package cache")
    ap.add_argument("--then-archs", default="",
                    help="start --side-by-side: then build the recipe for these archs (e.g. '80;90') on the whole node; "
                         "`wait` audits it and sets the planner's prediction beside it")
    ap.add_argument("--serial", action="store_true",
                    help="start: flash-attn compiles alone, timed against the planner; flash-attn-3 and demo-ext "
                         "start when it is done")
    remembered = ap.add_argument_group("given to start, remembered by the later phases of the run (given again, they win)")
    remembered.add_argument("--python", help="python of the node's torch environment (mirrored as the upstream)")
    remembered.add_argument("--archs", help="flash-attn's GPU archs, its cuda_archs (e.g. '80;90'; default 90)")
    remembered.add_argument("--head-dims", help="build only these flash-attn head dims (e.g. '128')")
    remembered.add_argument("--no-flash-attn", action="store_true", default=None, help="rehearse with demo-ext only")
    remembered.add_argument("--fa3", action="store_true", default=None,
                            help="build, install and test FlashAttention-3 too (recipe/flash-attn-3)")
    remembered.add_argument("--fa3-head-dims", help="flash-attn-3 subset: head dims (default 128)")
    remembered.add_argument("--fa3-dtypes", help="flash-attn-3 subset: dtypes (default 'bf16;fp16')")
    remembered.add_argument("--fa3-features", help="flash-attn-3 subset: optional kernel families (default 'bwd;varlen')")
    remembered.add_argument("--fa3-parts", type=int,
                            help="flash-attn-3 as a split build: N parts at once, each on its share of the run's CPUs "
                                 "(extforge build --part I/N, as a Slurm array would run them), then the link job")
    remembered.add_argument("--side-by-side", action="store_true", default=None,
                            help="start: the flash-attn recipe build timed by bench/build_side_by_side.py, then the same "
                                 "sdist with upstream's setup.py and the same settings (nothing else builds); `wait` "
                                 "collects both")
    remembered.add_argument("--extras", help=f"distributions of the node env to mirror too (default {DEFAULT_EXTRAS})")
    remembered.add_argument("--cuda-home", help="the node's CUDA toolkit, packaged into the mirror channel "
                                                "(default: $CUDA_HOME or /usr/local/cuda)")
    return ap


def options(args: argparse.Namespace, saved: dict[str, Any]) -> Options:
    """`start` (and `all`) begins a run from what it is given; the later phases take what start
    remembered where this call gives nothing."""
    given = vars(args)
    merged = merged_options({k: given[k] for k in REMEMBERED}, {} if args.phase in ("start", "all") else saved, defaults())
    rest = {k: v for k, v in given.items()
            if k not in REMEMBERED and k not in ("phase", "so", "budget", "python_version", "sources")}
    return Options(**merged, **rest, deadline=time.monotonic() + args.budget)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    # This process reads ELF files (symbols_only) and packages itself: the bundled dependencies,
    # once unpacked, and extforge's own modules.
    sys.path[:0] = [str(REPO / "src"), str(args.work / "site")]
    if args.phase == "symbols":
        args.out.mkdir(parents=True, exist_ok=True)
        print(symbols_only(args.so, args.out))
        return 0
    if args.phase == "carry":
        prepare_carry(args.python_version, args.sources)
        return 0
    # Each call's output folder starts empty: restore the summary so far from the work folder.
    run = Run(args.work, args.out)
    o = options(args, run.state["options"])
    if args.phase in ("start", "all"):
        run.remember({k: getattr(o, k) for k in REMEMBERED})
    def killed(*_: object) -> None:
        run.end("killed (SIGTERM)")
        sys.exit(143)

    signal.signal(signal.SIGTERM, killed)
    run.begin(args.phase)
    outcome = "done"
    try:
        if args.phase in ("start", "all"):
            phase_start(run, o)
        if args.phase == "wait":
            phase_wait(run, o)
        if args.phase in ("finish", "all"):
            phase_finish(run, o)
        if args.phase in ("wheels", "all"):
            phase_wheels(run, o)
        if args.phase in ("rebuild", "all"):
            phase_rebuild(run, o)
    except StepFailed as failed:
        print(f"stopped: step '{failed}' failed", flush=True)
        outcome = f"stopped at '{failed}'"
        bundle_results(run)
    run.end(outcome)
    return 0 if run.ok() else 1
