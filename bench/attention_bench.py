"""Speed of flash-attn's flash_attn_func (and FlashAttention-3's, where installed) against torch
SDPA on one GPU, in TFLOP/s.

Run with the python of the environment under test (an installed prefix), on a GPU node:

    python bench/attention_bench.py [--reps 100] [--out results.json] [--write-docs]

For each case (bf16, batch 4, seq 4096, hidden 2048 as heads x head dim; causal and not, head
dim 128 and 64) it times the forward and forward+backward of both implementations in the same
process: CUDA events around every call, after a warm-up, median of --reps calls,
the implementations taking turns in 10 blocks (GPU clock drift hits each alike); inputs require
grad in both modes, as in flash-attn's benchmarks. FLOPs are
counted as flash-attn's own benchmarks count them: 4*b*s*s*h*d for the forward, halved when
causal; the backward is 2.5x the forward. SDPA gets its own (batch, heads, seq, dim) contiguous
copies, so no layout conversion is timed.

The packaging claim is judged on the reference case (causal, head dim 128): the ratio of
flash-attn's forward TFLOP/s to SDPA's must be within 3% of the ratio a plain
`setup.py bdist_wheel` build of the same flash-attn source reached on an H100: 312 / 531.

Prints a table on stdout; writes JSON to --out (default: $EXTFORGE_BENCH_OUT, if set);
--write-docs appends a dated section to docs/benchmarks-history.md. A head-dim subset build is timed on
its own head dims only. Exit code: 0 ratio within 3%, 3 outside it, 2 could not run (no CUDA
device, no flash_attn, or no kernels for the reference head dim); 1 is a crash, never a verdict.
Where the flash-attn-3 package is installed (`flash_attn_interface`), FlashAttention-3 is timed in
the same run, and its goal on the reference case is judged too: FA3/SDPA >= 1.15 forward and
>= 1.10 forward+backward (what a hand build of upstream's hopper/setup.py reached on an H100:
665/572 forward, 502/445 forward+backward); a miss is exit code 3 as well. Where that build has
fp8 kernels, FA3's fp8 (e4m3) forward is timed on the reference case beside SDPA's bf16 forward
(`fa3 fp8/sdpa ratio`): reported, not judged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import append_section

OUT_ENV = "EXTFORGE_BENCH_OUT"
# flash-attn 2.8.3 built with plain `setup.py bdist_wheel` vs torch SDPA, on an H100 80GB with
# torch 2.11.0+cu130: bf16 causal forward, batch 4, seq 4096, 16 heads, head dim 128.
REFERENCE_FLASH_TFLOPS, REFERENCE_SDPA_TFLOPS = 312.0, 531.0
REFERENCE_RATIO = REFERENCE_FLASH_TFLOPS / REFERENCE_SDPA_TFLOPS
RATIO_TOLERANCE = 0.03
IMPLS = ("flash_attn", "sdpa")
FA3 = "fa3"
FA3_FP8 = "fa3_fp8"
# FlashAttention-3 over SDPA on the reference case, per mode, that the package must reach.
FA3_GOALS = {"fwd": 1.15, "fwd_bwd": 1.10}
MODES = ("fwd", "fwd_bwd")
# Blocks the timed calls of each mode are cut into, the implementations taking turns.
ROUNDS = 10


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    causal: bool
    dtype: str = "bfloat16"

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"{self.dtype} {mask} b{self.batch} s{self.seqlen} h{self.nheads} d{self.headdim}"


REFERENCE_CASE = Case(batch=4, seqlen=4096, nheads=16, headdim=128, causal=True)
CASES = (
    REFERENCE_CASE,
    Case(batch=4, seqlen=4096, nheads=16, headdim=128, causal=False),
    Case(batch=4, seqlen=4096, nheads=32, headdim=64, causal=True),
    Case(batch=4, seqlen=4096, nheads=32, headdim=64, causal=False),
)


def built_head_dims() -> tuple[int, ...] | None:
    """Head dims every installed build has kernels for (None: every head dim), from the build
    records the recipes write: a head-dim subset of flash-attn (flash_attn_head_dims) or of
    FlashAttention-3 (fa3_head_dims) has only those kernels."""
    records = Path(sys.prefix) / "share" / "extforge" / "build"
    built: set[int] | None = None
    # flash-attn's record says "all" or "64;128", FlashAttention-3's holds a list.
    for name, dims_of in (("flash-attn.json", lambda r: None if str(r.get("head_dims") or "all") == "all"
                           else str(r["head_dims"]).split(";")),
                          ("flash-attn-3.json", lambda r: r["subset"]["head_dims"])):
        record = records / name
        if record.is_file() and (dims := dims_of(json.loads(record.read_text()))) is not None:
            subset = {int(d) for d in dims}
            built = subset if built is None else built & subset
    return None if built is None else tuple(sorted(built))


def fa3_built(kind: str, value: str) -> bool:
    """Whether the installed FlashAttention-3 build has these kernels: its build record's subset
    ("dtypes" fp8, "features" bwd); a build without a record is upstream's full one."""
    record = Path(sys.prefix) / "share" / "extforge" / "build" / "flash-attn-3.json"
    return not record.is_file() or value in json.loads(record.read_text())["subset"].get(kind, [value])


def built_cases() -> tuple[Case, ...]:
    built = built_head_dims()
    return CASES if built is None else tuple(c for c in CASES if c.headdim in built)


@dataclass(frozen=True)
class Timing:
    case: Case
    impl: str
    mode: str
    median_ms: float
    tflops: float


def attention_flops(case: Case, mode: str) -> float:
    forward = 4 * case.batch * case.seqlen**2 * case.nheads * case.headdim / (2 if case.causal else 1)
    return forward * {"fwd": 1.0, "fwd_bwd": 3.5}[mode]


def tflops(case: Case, mode: str, median_ms: float) -> float:
    return attention_flops(case, mode) / (median_ms * 1e-3) / 1e12


def lookup(timings: list[Timing], case: Case, impl: str, mode: str) -> Timing | None:
    """The timing of this case, implementation and mode; None where it was not timed (FA3's
    backward on a build without backward kernels)."""
    return next((t for t in timings if (t.case, t.impl, t.mode) == (case, impl, mode)), None)


def find(timings: list[Timing], case: Case, impl: str, mode: str) -> Timing:
    found = lookup(timings, case, impl, mode)
    if found is None:
        raise LookupError(f"no {impl} {mode} timing of {case.label}")
    return found


def timed(timings: list[Timing], impl: str) -> bool:
    return any(t.impl == impl for t in timings)


def ratio_verdict(timings: list[Timing]) -> dict[str, Any]:
    """flash-attn/SDPA forward ratio of the reference case, against the plain build's; with FA3
    timed, its ratios to SDPA per mode against FA3_GOALS. An implementation that is not
    installed is not judged (its fields are None)."""
    sdpa = find(timings, REFERENCE_CASE, "sdpa", "fwd").tflops
    flash = find(timings, REFERENCE_CASE, "flash_attn", "fwd").tflops if timed(timings, "flash_attn") else None
    ratio = None if flash is None else flash / sdpa
    fa3 = {}
    if timed(timings, FA3):
        for mode, goal in FA3_GOALS.items():
            if (fa3_timing := lookup(timings, REFERENCE_CASE, FA3, mode)) is None:
                continue
            got = fa3_timing.tflops / find(timings, REFERENCE_CASE, "sdpa", mode).tflops
            fa3[mode] = {"ratio": got, "goal": goal, "met": got >= goal}
    fp8 = [t for t in timings if t.impl == FA3_FP8 and t.case == REFERENCE_CASE]
    return {
        "fa3": fa3,
        "fa3_fp8_sdpa_ratio": fp8[0].tflops / sdpa if fp8 else None,
        "case": REFERENCE_CASE.label,
        "flash_attn_tflops": flash,
        "sdpa_tflops": sdpa,
        "ratio": ratio,
        "reference_ratio": REFERENCE_RATIO,
        "reference": f"{REFERENCE_FLASH_TFLOPS:g} / {REFERENCE_SDPA_TFLOPS:g} TFLOP/s",
        "within_tolerance": None if ratio is None else abs(ratio / REFERENCE_RATIO - 1) <= RATIO_TOLERANCE,
        "tolerance": RATIO_TOLERANCE,
    }


def table_rows(timings: list[Timing]) -> list[list[str]]:
    """One row per case and mode: the speeds, flash-attn's ratio to SDPA (and FA3's, where timed)."""
    rows = []
    with_fa3 = timed(timings, FA3)
    for case in dict.fromkeys(t.case for t in timings):
        for mode in MODES:
            sdpa = find(timings, case, "sdpa", mode)
            if timed(timings, "flash_attn"):
                flash = find(timings, case, "flash_attn", mode)
                fa2 = [f"{flash.tflops:.0f}", f"{sdpa.tflops:.0f}", f"{flash.tflops / sdpa.tflops:.3f}",
                       f"{flash.median_ms:.3f}"]
            else:
                fa2 = ["not installed", f"{sdpa.tflops:.0f}", "-", "-"]
            row = [case.label, mode, *fa2, f"{sdpa.median_ms:.3f}"]
            if with_fa3:
                fa3 = lookup(timings, case, FA3, mode)
                row += [f"{fa3.tflops:.0f}", f"{fa3.tflops / sdpa.tflops:.3f}"] if fa3 else ["not built", "-"]
            rows.append(row)
    return rows


HEADER = ["case", "mode", "flash-attn TFLOP/s", "SDPA TFLOP/s", "ratio", "flash-attn ms", "SDPA ms"]
FA3_HEADER = ["FA3 TFLOP/s", "FA3/SDPA"]


def header(rows: list[list[str]]) -> list[str]:
    return HEADER + (FA3_HEADER if rows and len(rows[0]) > len(HEADER) else [])


def render_text(rows: list[list[str]]) -> str:
    head = header(rows)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *rows])


def flash_attn_sentence(verdict: dict[str, Any]) -> str:
    """flash-attn 2's verdict on the reference case, in words."""
    if verdict["ratio"] is None:
        return f"flash-attn 2 is not installed, not judged (SDPA {verdict['sdpa_tflops']:.0f} TFLOP/s)"
    return (f"flash-attn {verdict['flash_attn_tflops']:.0f} / SDPA {verdict['sdpa_tflops']:.0f} TFLOP/s = ratio "
            f"{verdict['ratio']:.3f}; a plain setup.py build reached {verdict['reference_ratio']:.3f} "
            f"({verdict['reference']}): {'within' if verdict['within_tolerance'] else 'NOT within'} "
            f"{verdict['tolerance']:.0%}")


def render_docs(report: dict[str, Any]) -> list[str]:
    """The dated section for docs/benchmarks-history.md."""
    env, verdict = report["environment"], report["verdict"]
    lines = [
        f"## Attention speed: flash-attn vs torch SDPA ({report['date']})",
        "",
        f"Machine: {env['gpu']}, {env['cpu_count']} CPU cores; torch {env['torch']} (CUDA {env['cuda']}), "
        f"flash-attn {env['flash_attn']} from `{env['flash_attn_path']}` "
        f"(conda package: {', '.join(env['flash_attn_package']) or 'none'}). `bench/attention_bench.py`: "
        f"CUDA events, median of {report['reps']} calls after warm-up, the implementations taking turns in {ROUNDS} blocks; FLOPs counted as flash-attn's "
        "benchmarks do (4·b·s²·h·d forward, /2 causal, backward 2.5x forward). "
        f"SDPA kernels: {', '.join(env['sdpa_kernels']) or 'unknown'}.",
        "",
        "| " + " | ".join(header(report["table"])) + " |",
        "|" + "---|" * len(header(report["table"])),
        *("| " + " | ".join(row) + " |" for row in report["table"]),
        "",
        f"Reference case ({verdict['case']}, forward): {flash_attn_sentence(verdict)}.",
    ]
    if verdict.get("fa3"):
        fa3 = verdict["fa3"]
        lines += [
            "",
            f"FlashAttention-3 ({', '.join(env.get('fa3_package') or ['not a conda package'])}), reference case:",
            "",
            f"- fa3/sdpa ratio: {fa3['fwd']['ratio']:.3f} (forward; goal >= {fa3['fwd']['goal']:.2f}: "
            f"{'met' if fa3['fwd']['met'] else 'NOT met'})",
            f"- fa3/sdpa fwd+bwd ratio: {fa3['fwd_bwd']['ratio']:.3f} (goal >= {fa3['fwd_bwd']['goal']:.2f}: "
            f"{'met' if fa3['fwd_bwd']['met'] else 'NOT met'})" if "fwd_bwd" in fa3 else
            "- fa3/sdpa fwd+bwd ratio: not measured (this FlashAttention-3 build has no backward kernels)",
        ]
    if verdict.get("fa3_fp8_sdpa_ratio") is not None:
        lines.append(f"- {fp8_sentence(verdict)}")
    return lines


def fp8_sentence(verdict: dict[str, Any]) -> str:
    return (f"fa3 fp8/sdpa ratio: {verdict['fa3_fp8_sdpa_ratio']:.3f} (FA3's e4m3 forward against SDPA's bf16 "
            "forward; reported, no goal)")


def _time_interleaved(calls: dict[str, Any], *, reps: int, warmup: int, rounds: int) -> dict[str, float]:
    """Median ms per call of each callable. The callables take turns in `rounds` blocks of
    reps/rounds calls, so a GPU whose clock drifts over the run (power, heat) slows each of them
    alike instead of whichever happens to be timed last."""
    import torch

    for fn in calls.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    per_round = max(1, reps // rounds)
    events: dict[str, list] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(per_round)]
            for start, end in pairs:
                start.record()
                fn()
                end.record()
            events[name] += pairs
        torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in pairs) for name, pairs in events.items()}


def _inputs(case: Case):
    """q, k, v in flash-attn's (b, s, h, d) layout and SDPA's (b, h, s, d) copies of them."""
    import torch

    dtype = getattr(torch, case.dtype)
    shape = (case.batch, case.seqlen, case.nheads, case.headdim)
    bshd = [torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]
    bhsd = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in bshd]
    return bshd, bhsd


def measure(case: Case, *, reps: int = 100, warmup: int = 20, rounds: int = ROUNDS) -> list[Timing]:
    """Forward and forward+backward timings of flash_attn_func, SDPA (and FA3) for one case,
    the implementations interleaved per mode."""
    import importlib.util

    import torch
    import torch.nn.functional as F

    bshd, bhsd = _inputs(case)
    calls = {"sdpa": lambda: F.scaled_dot_product_attention(*bhsd, is_causal=case.causal)}
    if importlib.util.find_spec("flash_attn") is not None:
        from flash_attn import flash_attn_func

        calls["flash_attn"] = lambda: flash_attn_func(*bshd, causal=case.causal)
    leaves = {"flash_attn": bshd, "sdpa": bhsd, FA3: bshd}
    fa3 = fa3_func()
    if fa3 is not None:
        calls[FA3] = lambda: fa3(*bshd, causal=case.causal)

    def fwd_bwd(impl: str):
        call, grad = calls[impl], torch.randn_like(calls[impl]())
        return lambda: torch.autograd.grad(call(), leaves[impl], grad)

    # A FlashAttention-3 subset without backward kernels is timed forward only.
    with_bwd = [impl for impl in calls if impl != FA3 or fa3_built("features", "bwd")]
    per_mode = {
        "fwd": _time_interleaved(calls, reps=reps, warmup=warmup, rounds=rounds),
        "fwd_bwd": _time_interleaved({impl: fwd_bwd(impl) for impl in with_bwd}, reps=reps, warmup=warmup, rounds=rounds),
    }
    return [Timing(case, impl, mode, ms[impl], tflops(case, mode, ms[impl]))
            for impl in calls for mode, ms in per_mode.items() if impl in ms]


def measure_fp8(case: Case, *, reps: int = 100, warmup: int = 20, rounds: int = ROUNDS) -> list[Timing]:
    """FA3's fp8 (e4m3) forward, interleaved with SDPA's bf16 forward on the same case: the
    speed an inference site gets from the fp8 kernels. Inputs are the bf16 ones cast down, with
    no descale factors (the kernels' default of 1)."""
    import torch
    import torch.nn.functional as F

    fa3 = fa3_func()
    bshd, bhsd = _inputs(case)
    fp8 = [x.detach().to(torch.float8_e4m3fn) for x in bshd]
    with torch.no_grad():
        ms = _time_interleaved({"sdpa": lambda: F.scaled_dot_product_attention(*bhsd, is_causal=case.causal),
                                FA3_FP8: lambda: fa3(*fp8, causal=case.causal)}, reps=reps, warmup=warmup, rounds=rounds)
    return [Timing(case, FA3_FP8, "fwd", ms[FA3_FP8], tflops(case, "fwd", ms[FA3_FP8]))]


def fa3_func():
    """FlashAttention-3's flash_attn_func where the flash-attn-3 package is installed, else None."""
    import importlib.util

    if importlib.util.find_spec("flash_attn_interface") is None:
        return None
    from flash_attn_interface import flash_attn_func

    return flash_attn_func


def _sdpa_kernels(case: Case) -> list[str]:
    """Names of the GPU kernels one SDPA forward launches (which backend torch picked)."""
    import torch
    import torch.nn.functional as F

    _, bhsd = _inputs(case)
    # Only a label for the report: a profiler that cannot trace here must not cost the timings.
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(*bhsd, is_causal=case.causal)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except Exception as exc:
        return [f"(profiler failed: {exc})"]
    return [name[:80] for name in dict.fromkeys(names)]


def _environment() -> dict[str, Any]:
    import torch

    try:
        import flash_attn
    except ImportError:
        flash_attn = None
    return {
        "gpu": torch.cuda.get_device_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flash_attn": flash_attn.__version__ if flash_attn else "not installed",
        "flash_attn_path": str(Path(flash_attn.__file__).parent) if flash_attn else "",
        # name-version-build of the conda package, when this python is a conda prefix's
        "flash_attn_package": [p.stem for p in Path(sys.prefix, "conda-meta").glob("flash-attn-2*.json")],
        "fa3_package": [p.stem for p in Path(sys.prefix, "conda-meta").glob("flash-attn-3-*.json")],
        "python": sys.executable,
    }


def run(*, reps: int) -> dict[str, Any]:
    timings = [t for case in built_cases() for t in measure(case, reps=reps)]
    if fa3_func() is not None and fa3_built("dtypes", "fp8"):
        timings += measure_fp8(REFERENCE_CASE, reps=reps)
    env = _environment()
    env["sdpa_kernels"] = _sdpa_kernels(REFERENCE_CASE)
    return {
        "date": dt.date.today().isoformat(),
        "reps": reps,
        "environment": env,
        "timings": [{**asdict(t), "case": t.case.label} for t in timings],
        "table": table_rows(timings),
        "verdict": ratio_verdict(timings),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=100, help="timed calls per measurement (median)")
    parser.add_argument("--out", type=Path, default=os.environ.get(OUT_ENV), help=f"JSON results (default ${OUT_ENV})")
    parser.add_argument("--write-docs", action="store_true", help="append a dated section to docs/benchmarks-history.md")
    args = parser.parse_args(argv)

    try:
        import torch
        if fa3_func() is None:
            import flash_attn  # noqa: F401
    except ImportError as exc:
        print(f"error: cannot benchmark: {exc}. Run this with the python of the environment under test.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"error: cannot benchmark: torch {torch.__version__} sees no CUDA device.", file=sys.stderr)
        return 2

    if REFERENCE_CASE not in built_cases():
        print(f"error: cannot benchmark: this flash-attn build has no kernels for head dim {REFERENCE_CASE.headdim} "
              f"(built: {', '.join(map(str, built_head_dims() or ()))}); benchmark a build that has them.", file=sys.stderr)
        return 2
    report = run(reps=args.reps)
    print(render_text(report["table"]))
    verdict = report["verdict"]
    print(
        f"\nreference case: {flash_attn_sentence(verdict)}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for mode, fa3 in verdict["fa3"].items():
        print(f"FlashAttention-3 / SDPA, {mode}: {fa3['ratio']:.3f} (goal >= {fa3['goal']:.2f}: "
              + ("met)" if fa3["met"] else "NOT met)"))
    if verdict["fa3_fp8_sdpa_ratio"] is not None:
        print(fp8_sentence(verdict))
    if args.write_docs:
        append_section(render_docs(report))
    judged = verdict["within_tolerance"] is not False and all(f["met"] for f in verdict["fa3"].values())
    return 0 if judged else 3


if __name__ == "__main__":
    sys.exit(main())
