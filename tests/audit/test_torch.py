"""A real torch extension, compiled against torch 2.14.1, audited against its own torch and another."""

from __future__ import annotations

import pytest

from extforge.audit import audit_target


@pytest.mark.slow
def test_torch_extension_passes_against_its_torch_and_fails_against_another(torch_ext):
    ext, new, old = torch_ext
    good = audit_target(ext, against=new)
    assert good.ok, good.render()
    assert good.torch == "2.14.1+cu130" and good.target_cxx11_abi is True

    bad = audit_target(ext, against=old)
    assert bad.torch == "2.13.0+cpu"
    symbols = {f.symbol: f for f in bad.errors if f.check == "symbols"}
    assert "at::_ops::linalg_matrix_sqrth::call(at::Tensor const&)" in symbols
    finding = symbols["at::_ops::linalg_matrix_sqrth::call(at::Tensor const&)"]
    assert finding.library == "libtorch_cpu.so"
    assert finding.cause.startswith("torch version skew") and "2.13.0+cpu" in finding.cause
    assert not [f for f in bad.errors if f.check == "abi"]
