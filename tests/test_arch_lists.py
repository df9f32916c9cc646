"""GPU arch lists in every spelling the commands and variant files use, read by one parser
(fatbin.parse_arch_list): `9.0` (variants' cuda_archs), `80,90` (plan --archs), `sm_80,sm_90`
(audit --archs), `compute_90`, `9.0a`, `9.0+PTX`. Before it, each command had its own: plan
split on `,;` only, audit on `,` only, and `--variant cuda_archs=sm_90` reached the build layer as
written, which failed in the build script ("Script failed to execute", the reason only in the log).
"""

from __future__ import annotations

import json

import pytest

from cli_run import run_extforge
from extforge.audit.policy import arch_names
from extforge.cli import main
from extforge.commands.recipe import cuda_archs
from extforge.fatbin import Arch, parse_arch_list, torch_arch_list

SPELLINGS = ["8.0;9.0", "80,90", "sm_80,sm_90", "sm_80 sm_90", "8.0, 90; sm_90", " 80 ;\t9.0 "]


@pytest.mark.parametrize("text", SPELLINGS)
def test_every_spelling_of_a_list_is_one_typed_list(text: str) -> None:
    assert parse_arch_list(text) == (Arch(80), Arch(90))


def test_suffixes_and_ptx_keep_their_meaning() -> None:
    assert parse_arch_list("9.0a") == parse_arch_list("sm_90a") == (Arch(90, "a"),)
    assert parse_arch_list("10.0f,sm_100f") == (Arch(100, "f"),)
    assert parse_arch_list("compute_90") == (Arch(90, ptx=True),)
    assert parse_arch_list("9.0+PTX") == (Arch(90), Arch(90, ptx=True))
    assert [a.name for a in parse_arch_list("8.0;9.0a+PTX")] == ["sm_80", "sm_90a", "compute_90a"]
    # The build layer's form, back: PTX alone has no TORCH_CUDA_ARCH_LIST entry but X.Y+PTX.
    assert torch_arch_list(parse_arch_list("sm_80,sm_90,compute_90")) == ("8.0", "9.0+PTX")
    assert torch_arch_list(parse_arch_list("compute_100f")) == ("10.0f+PTX",)


@pytest.mark.parametrize(("text", "message"), [
    ("hopper", "not a CUDA arch: 'hopper' (write 8.0, 80, sm_80 or compute_80"),
    ("sm_90+PTX", "not a CUDA arch: 'sm_90+PTX'"),
    ("9.0+PTXX", "not a CUDA arch: '9.0+PTXX'"),
    ("sm_91", "not a known CUDA arch: 'sm_91'"),
    ("8.0a", "arch-specific 'a' code exists from sm_90 on"),
    (" ;, ", "no GPU arch given"),
])
def test_anything_else_is_refused_with_the_forms_accepted(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_arch_list(text)
    assert message in str(err.value)


@pytest.mark.parametrize("text", SPELLINGS)
def test_plan_audit_and_recipe_new_take_every_spelling(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """plan took `80,90` and `sm_80;9.0` but not `sm_80 sm_90`; audit took `sm_80,sm_90` but not
    `8.0;9.0`; recipe new took what plan took."""
    assert main(["plan", "--profile", "any-extension", "--cores", "2", "--memory", "24G", "--archs", text, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["archs"] == ["80", "90"]
    assert arch_names(text) == ["sm_80", "sm_90"]  # the type of `audit --archs`
    assert cuda_archs(text) == ("8.0", "9.0")  # the type of `recipe new --archs`


def test_a_bad_arch_option_is_a_usage_error_naming_the_forms() -> None:
    proc = run_extforge("plan", "--archs", "sm_90,Hopper")
    assert proc.returncode == 2 and "not a CUDA arch: 'Hopper' (write 8.0, 80, sm_80" in proc.stderr


def test_plan_plans_the_archs_of_a_variant_as_build_would(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --variant cuda_archs=sm_90` planned the default 80,90: the variant's archs were not read."""
    assert main(["plan", "--profile", "any-extension", "--cores", "2", "--memory", "24G", "--variant", "cuda_archs=sm_90",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["archs"] == ["90"]
