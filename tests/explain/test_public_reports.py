"""explain on messages copied verbatim from public reports (source URL in each file's header)
for failures this machine cannot produce: no GPU, no driver, no old toolkit, no network."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from extforge.doctor.explain import explain_text, load_signatures

DATA = Path(__file__).with_name("data")
FIXTURES = sorted(DATA.glob("*.txt"))


def expectation(path: Path) -> tuple[str, str | None]:
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith("# expect:"))
    parts = line.split(":", 1)[1].split()
    return parts[0], parts[1] if len(parts) > 1 else None


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_public_report(path: Path) -> None:
    want_id, want_variant = expectation(path)
    result = explain_text(path.read_text(), torch_abi=None)
    if want_id == "unknown":
        assert not result.recognised
        assert "unknown" in result.render() and "extforge doctor" in result.render()
        return
    primary = result.diagnoses[0]
    assert (primary.id, primary.variant) == (want_id, want_variant)
    sig = next(s for s in load_signatures() if s.id == want_id)
    fields = [f for _, f, _, _ in string.Formatter().parse(sig.title) if f and not f.endswith("_text")]
    assert all(f in primary.values for f in fields), primary.title  # the title's placeholders were filled
    assert primary.cause and primary.fix


def test_every_signature_has_a_public_or_real_case() -> None:
    covered = {expectation(p)[0] for p in FIXTURES}
    real = {"build-isolation", "oom-killed", "ninja-build-stopped", "undefined-symbol", "source-missing"}  # test_real_failures.py
    assert {s.id for s in load_signatures()} <= covered | real


def test_values_extracted_from_reports() -> None:
    wheel = explain_text((DATA / "wheel-download-flash-attn-1418.txt").read_text()).diagnoses[0]
    assert (wheel.values["wheel_torch"], wheel.values["wheel_abi"], wheel.values["wheel_python"]) == ("2.4", "FALSE", "cp310")
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE" in wheel.fix
    driver = explain_text((DATA / "driver-too-old-fooocus-1313.txt").read_text()).diagnoses[0]
    assert driver.values["driver_cuda"] == "11.4"
    nvcc = explain_text((DATA / "nvcc-too-old-prompt4driving-5.txt").read_text()).diagnoses[0]
    assert (nvcc.values["required"], nvcc.values["torch"]) == ("11.7", "1.9.0+cu111")
    abi = explain_text((DATA / "undefined-symbol-abi-flash-attn-1691.txt").read_text()).diagnoses[0]
    assert abi.values["demangled"] == (
        "c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >)"
    )
