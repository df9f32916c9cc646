"""Node admission logic and the NVML version encoding, on recorded facts."""

from __future__ import annotations

import dataclasses
import json

from extforge.doctor.model import DriverFacts, Gpu
from extforge.environment.admission import admission_checks
from extforge.environment.node import NodeFacts, cuda_version_from_int, probe_nvml
from extforge.fatbin import arch_runs_on
from extforge.stamp import AuditStamp, read_stamps

FLASH_JSON = {"schema": 1, "name": "flash-attn", "version": "2.8.3", "sass_archs": ["sm_80", "sm_90"], "ptx_archs": [],
              "glibc_floor": "2.17", "cuda_version": "13.0", "verdict": "pass"}
FLASH = AuditStamp.from_json(FLASH_JSON)


def _node(cuda: str | None, caps: list[str], glibc: str = "2.36") -> NodeFacts:
    gpus = tuple(Gpu(f"GPU {c}", c) for c in caps)
    return NodeFacts(DriverFacts("580.65.06" if cuda else None, cuda, gpus, source="recorded"), glibc)


def _verdicts(checks) -> dict[str, str]:
    return {c.name: c.verdict for c in checks}


def test_arch_rules():
    assert arch_runs_on("sm_80", "8.6") and arch_runs_on("sm_80", "8.0")
    assert not arch_runs_on("sm_86", "8.0") and not arch_runs_on("sm_80", "9.0")
    assert arch_runs_on("sm_90a", "9.0") and not arch_runs_on("sm_90a", "9.1")
    assert arch_runs_on("sm_100f", "10.3")
    assert arch_runs_on("compute_80", "9.0", ptx=True) and not arch_runs_on("compute_90", "8.0", ptx=True)


def test_h100_node_with_new_driver_is_admitted():
    assert _verdicts(admission_checks([FLASH], _node("13.0", ["9.0"]), "13.0")) == {
        "driver-cuda": "pass", "gpu-arch": "pass", "glibc": "pass"}


def test_old_driver_uncovered_gpu_and_old_glibc_fail_with_reasons():
    checks = admission_checks([dataclasses.replace(FLASH, glibc_floor="2.38")], _node("12.4", ["9.0", "12.0"], glibc="2.31"), None)
    assert _verdicts(checks) == {"driver-cuda": "fail", "gpu-arch": "fail", "glibc": "fail"}
    (gpu,) = [c for c in checks if c.name == "gpu-arch"]
    assert gpu.findings == ("flash-attn 2.8.3 has no code for GPU 1 (GPU 12.0, sm_120): sass ['sm_80', 'sm_90'], ptx []",)


def test_cpu_node_skips_gpu_checks():
    assert _verdicts(admission_checks([FLASH], _node(None, []), "13.0")) == {
        "driver-cuda": "skip", "gpu-arch": "skip", "glibc": "pass"}


def test_audit_records_are_read_from_the_prefix(tmp_path):
    d = tmp_path / "share/extforge/audit"
    d.mkdir(parents=True)
    (d / "flash-attn.json").write_text(json.dumps({**FLASH_JSON, "added_by_a_newer_extforge": 1}))
    assert read_stamps(tmp_path) == [FLASH]
    assert {k: v for k, v in FLASH.to_json().items() if v is not None} == FLASH_JSON


def test_nvml_encoding_and_missing_library():
    assert cuda_version_from_int(13000) == "13.0" and cuda_version_from_int(12080) == "12.8"
    assert probe_nvml("libnvidia-ml-does-not-exist.so.1") is None
