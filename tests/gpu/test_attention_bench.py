"""bench/attention_bench.py: its arithmetic and report, on any machine. The speed verdict itself
(flash-attn/SDPA within 3% of a plain build's) is what the bench prints on a GPU, never a test:
a ratio measured on another node and day gates nothing."""

from __future__ import annotations

import math

import pytest
from gpu_env import load_bench

bench = load_bench()


def _timings(flash_ms: float, sdpa_ms: float):
    """Timings for every case, flash-attn at flash_ms and SDPA at sdpa_ms in every mode."""
    return [
        bench.Timing(case, impl, mode, ms, bench.tflops(case, mode, ms))
        for case in bench.CASES
        for impl, ms in (("flash_attn", flash_ms), ("sdpa", sdpa_ms))
        for mode in bench.MODES
    ]


def test_flops_are_counted_as_flash_attn_benchmarks_count_them():
    case = bench.REFERENCE_CASE
    # 4 * 4 * 4096^2 * 16 * 128 / 2 (causal)
    assert bench.attention_flops(case, "fwd") == 4 * 4 * 4096**2 * 16 * 128 / 2 == 274877906944
    assert bench.attention_flops(case, "fwd_bwd") == 3.5 * 274877906944
    full = bench.Case(batch=4, seqlen=4096, nheads=16, headdim=128, causal=False)
    assert bench.attention_flops(full, "fwd") == 2 * bench.attention_flops(case, "fwd")
    # 274.9 GFLOP in 0.881 ms is the 312 TFLOP/s measured for the plain build.
    assert math.isclose(bench.tflops(case, "fwd", 0.881), 312.0, rel_tol=1e-3)


@pytest.mark.parametrize(
    ("flash_tflops", "sdpa_tflops", "within"),
    [(312, 531, True), (305, 531, True), (320, 531, True), (300, 531, False), (323, 531, False), (312, 500, False)],
)
def test_ratio_verdict_is_3_percent_around_the_plain_build(flash_tflops, sdpa_tflops, within):
    flops = bench.attention_flops(bench.REFERENCE_CASE, "fwd")
    flash_ms, sdpa_ms = (flops / (t * 1e12) * 1e3 for t in (flash_tflops, sdpa_tflops))
    verdict = bench.ratio_verdict(_timings(flash_ms, sdpa_ms))
    assert math.isclose(verdict["ratio"], flash_tflops / sdpa_tflops)
    assert verdict["within_tolerance"] is within


def test_docs_section_has_every_case_and_the_verdict():
    timings = _timings(1.0, 0.5)
    report = {
        "date": "2026-11-23",
        "reps": 100,
        "environment": {
            "gpu": "NVIDIA H100 80GB HBM3", "cpu_count": 16, "torch": "2.11.0+cu130", "cuda": "13.0",
            "flash_attn": "2.8.3", "flash_attn_path": "/prefix/lib/python3.12/site-packages/flash_attn",
            "flash_attn_package": ["flash-attn-2.8.3-cuda130_torch211_py312_h0123456_0"],
            "sdpa_kernels": ["cudnn_sdpa_kernel"],
        },
        "table": bench.table_rows(timings),
        "verdict": bench.ratio_verdict(timings),
    }
    text = "\n".join(bench.render_docs(report))
    assert text.startswith("## Attention speed: flash-attn vs torch SDPA (2026-11-23)")
    table = [line for line in text.splitlines() if line.startswith("| bfloat16")]
    assert len(table) == len(bench.CASES) * len(bench.MODES)
    assert all("| 0.500 |" in line for line in table)
    assert "ratio 0.500" in text and "NOT within 3%" in text
    assert "flash-attn-2.8.3-cuda130_torch211_py312_h0123456_0" in text
    assert "cudnn_sdpa_kernel" in text and "NVIDIA H100 80GB HBM3, 16 CPU cores" in text
    assert len(bench.render_text(report["table"]).splitlines()) == len(table) + 1


def test_a_head_dim_subset_build_is_timed_on_its_own_head_dims(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.sys, "prefix", str(tmp_path))
    assert bench.built_cases() == bench.CASES  # no build record: every head dim is built
    record = tmp_path / "share" / "extforge" / "build" / "flash-attn.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"head_dims": "128"}')
    assert {c.headdim for c in bench.built_cases()} == {128} and bench.REFERENCE_CASE in bench.built_cases()
    record.write_text('{"head_dims": "64"}')
    assert bench.REFERENCE_CASE not in bench.built_cases()


@pytest.mark.parametrize(("fwd", "fwd_bwd", "met"), [(1.16, 1.13, (True, True)), (1.14, 1.13, (False, True)),
                                                     (1.20, 1.05, (True, False))])
def test_fa3_goals_are_judged_per_mode(fwd, fwd_bwd, met):
    timings = _timings(2.0, 1.0) + [
        bench.Timing(case, bench.FA3, mode, 1.0 / r, bench.tflops(case, mode, 1.0 / r))
        for case in bench.CASES for mode, r in (("fwd", fwd), ("fwd_bwd", fwd_bwd))]
    verdict = bench.ratio_verdict(timings)
    assert math.isclose(verdict["fa3"]["fwd"]["ratio"], fwd) and math.isclose(verdict["fa3"]["fwd_bwd"]["ratio"], fwd_bwd)
    assert (verdict["fa3"]["fwd"]["met"], verdict["fa3"]["fwd_bwd"]["met"]) == met
    rows = bench.table_rows(timings)
    assert bench.header(rows)[-2:] == bench.FA3_HEADER and rows[0][-1] == f"{fwd:.3f}"
    text = "\n".join(bench.render_docs({"date": "2026-11-25", "reps": 100, "table": rows, "verdict": verdict,
                                        "environment": {"gpu": "H100", "cpu_count": 16, "torch": "2.11.0",
                                                        "cuda": "13.0", "flash_attn": "2.8.3", "flash_attn_path": "/p",
                                                        "flash_attn_package": [], "sdpa_kernels": [],
                                                        "fa3_package": ["flash-attn-3-3.0.0-x_0"]}}))
    assert f"fa3/sdpa ratio: {fwd:.3f}" in text and f"fa3/sdpa fwd+bwd ratio: {fwd_bwd:.3f}" in text
    assert "| FA3 TFLOP/s | FA3/SDPA |" in text


def test_fa3_fp8_is_reported_against_sdpa_bf16_without_a_goal():
    case = bench.REFERENCE_CASE
    fa3 = [bench.Timing(c, bench.FA3, mode, 0.8, bench.tflops(c, mode, 0.8)) for c in bench.CASES for mode in bench.MODES]
    fp8 = bench.Timing(case, bench.FA3_FP8, "fwd", 0.5, bench.tflops(case, "fwd", 0.5))
    timings = _timings(2.0, 1.0) + fa3 + [fp8]
    verdict = bench.ratio_verdict(timings)
    assert math.isclose(verdict["fa3_fp8_sdpa_ratio"], 2.0)
    # The fp8 timing adds no row: the table stays one row per case and mode.
    assert len(bench.table_rows(timings)) == len(bench.CASES) * len(bench.MODES)
    assert "fa3 fp8/sdpa ratio: 2.000" in bench.fp8_sentence(verdict)


def test_fp8_is_timed_only_where_the_fa3_build_has_it(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.sys, "prefix", str(tmp_path))
    record = tmp_path / "share" / "extforge" / "build" / "flash-attn-3.json"
    record.parent.mkdir(parents=True)
    assert bench.fa3_built("dtypes", "fp8")  # no record: upstream's full build
    record.write_text('{"subset": {"head_dims": [128], "dtypes": ["bf16", "fp16"], "features": ["split"]}}')
    assert not bench.fa3_built("dtypes", "fp8") and not bench.fa3_built("features", "bwd")
    record.write_text('{"subset": {"head_dims": [64, 128], "dtypes": ["bf16", "fp16", "fp8"], "features": ["bwd"]}}')
    assert bench.fa3_built("dtypes", "fp8") and bench.fa3_built("features", "bwd")


def test_an_fa3_build_without_backward_is_judged_on_its_forward_alone():
    fa3 = [bench.Timing(c, bench.FA3, "fwd", 0.8, bench.tflops(c, "fwd", 0.8)) for c in bench.CASES]
    timings = _timings(2.0, 1.0) + fa3
    verdict = bench.ratio_verdict(timings)
    assert set(verdict["fa3"]) == {"fwd"}
    assert [r[-2:] for r in bench.table_rows(timings) if r[1] == "fwd_bwd"] == [["not built", "-"]] * len(bench.CASES)
    report = {"date": "2026-11-27", "reps": 100, "table": bench.table_rows(timings), "verdict": verdict,
              "environment": {"gpu": "NVIDIA H100 80GB HBM3", "cpu_count": 16, "torch": "2.11.0+cu130", "cuda": "13.0",
                              "flash_attn": "2.8.3", "flash_attn_path": "-", "flash_attn_package": [],
                              "sdpa_kernels": [], "fa3_package": []}}
    assert "fa3/sdpa fwd+bwd ratio: not measured" in "\n".join(bench.render_docs(report))


def test_without_fa3_the_report_is_unchanged():
    timings = _timings(2.0, 1.0)
    assert bench.ratio_verdict(timings)["fa3"] == {}
    assert bench.ratio_verdict(timings)["fa3_fp8_sdpa_ratio"] is None
    assert bench.header(bench.table_rows(timings)) == bench.HEADER


def test_without_flash_attn_2_only_fa3_is_judged():
    """A node with FlashAttention-3 alone: flash-attn 2 is said to be missing, never given numbers."""
    timings = [bench.Timing(case, impl, mode, ms, bench.tflops(case, mode, ms))
               for case in bench.CASES for impl, ms in (("sdpa", 1.2), (bench.FA3, 1.0)) for mode in bench.MODES]
    verdict = bench.ratio_verdict(timings)
    assert verdict["ratio"] is None and verdict["within_tolerance"] is None and verdict["fa3"]["fwd"]["met"]
    row = bench.table_rows(timings)[0]
    assert row[2:5] == ["not installed", f"{bench.tflops(bench.REFERENCE_CASE, 'fwd', 1.2):.0f}", "-"]
    assert row[-1] == "1.200"
    assert "flash-attn 2 is not installed, not judged" in bench.flash_attn_sentence(verdict)


def test_a_case_is_timed_only_where_every_installed_build_has_its_head_dim(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.sys, "prefix", str(tmp_path))
    records = tmp_path / "share" / "extforge" / "build"
    records.mkdir(parents=True)
    (records / "flash-attn-3.json").write_text('{"subset": {"head_dims": [64, 128]}}')
    assert bench.built_cases() == bench.CASES
    (records / "flash-attn.json").write_text('{"head_dims": "128"}')
    assert {c.headdim for c in bench.built_cases()} == {128}
    (records / "flash-attn-3.json").write_text('{"subset": {"head_dims": [64]}}')
    assert bench.built_cases() == ()
