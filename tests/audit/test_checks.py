"""Each planted defect in a real compiled binary is caught and named; the good case passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from extforge.audit import audit_target
from extforge.audit.elf import open_elf
from extforge.errors import ExtforgeError
from extforge.fatbin import arch_sets, parse_fatbin


def _errors(report, check):
    return [f for f in report.errors if f.check == check]


def test_good_extension_passes(elfs):
    report = audit_target(elfs["good"], against=elfs["v1"], glibc="2.36")
    assert report.ok, report.render()
    assert report.verdict == "pass"
    (module,) = report.modules
    assert module.cxx11_abi is True
    assert module.unresolved == 0
    assert report.target_cxx11_abi is True
    assert module.floors["GLIBCXX"] >= "3.4.21"


def test_old_abi_against_cxx11_library_names_the_symbol(elfs):
    report = audit_target(elfs["old_abi"], against=elfs["v1"])
    assert report.modules[0].cxx11_abi is False
    (abi,) = _errors(report, "abi")
    assert "_GLIBCXX_USE_CXX11_ABI=0" in abi.message
    # c++filt spells the old string std::string or std::basic_string<char, ...>, never __cxx11.
    assert abi.symbol.startswith("greeter::greet(std::") and "__cxx11" not in abi.symbol
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in abi.fix
    # The ABI error names the unresolved symbol; it is not reported a second time as unresolved.
    assert abi.symbol not in {f.symbol for f in _errors(report, "symbols")}
    assert len([f for f in report.errors if f.symbol == abi.symbol]) == 1
    assert not report.ok


def test_symbol_missing_from_the_target_library_is_demangled_and_grouped(elfs):
    assert audit_target(elfs["skew"], against=elfs["v2"]).ok
    report = audit_target(elfs["skew"], against=elfs["v1"])
    (finding,) = _errors(report, "symbols")
    assert finding.symbol == "greeter::added_in_v2(int)"
    assert finding.module == "ext_skew.so"
    assert not _errors(report, "abi")
    text = report.render()
    assert "1 unresolved symbol(s) expected from" in text and "greeter::added_in_v2(int)" in text


def test_library_not_in_target_is_an_error(elfs, tmp_path):
    (tmp_path / "pyvenv.cfg").write_text("home = /nonexistent\n")  # a venv without the library
    report = audit_target(elfs["good"], against=tmp_path)
    (finding,) = _errors(report, "libraries")
    assert finding.library == "libtarget.so"


def test_a_folder_that_is_no_environment_is_named_as_such(elfs, tmp_path):
    """The old code audited against an empty folder (every library "not found in the target
    environment"): a typo in --against read as a broken extension."""
    with pytest.raises(ExtforgeError, match="is neither a venv \\(no pyvenv.cfg\\) nor a conda prefix \\(no conda-meta\\)"):
        audit_target(elfs["good"], against=tmp_path)


def test_glibcxx_newer_than_the_floor_is_an_error(elfs):
    # Any use of the CXX11 std::string needs GLIBCXX_3.4.21; RHEL 7's gcc 4.8 has 3.4.19.
    report = audit_target(elfs["good"], against=elfs["v1"], glibc="2.17")
    messages = [f.message for f in _errors(report, "platform")]
    assert any("GLIBCXX_3.4.2" in m and "glibc 2.17" in m for m in messages), messages
    glibcxx = next(f for f in _errors(report, "platform") if "GLIBCXX" in f.message)
    assert glibcxx.symbol and "(" in glibcxx.symbol  # a demangled function that needs it


def test_fatbin_archs_are_read_from_nvcc_output(cuda_elfs):
    sm80 = open_elf(cuda_elfs["sm80"])
    sec = sm80.sections[".nv_fatbin"]
    assert arch_sets(parse_fatbin(sm80._map, sec.offset, sec.offset + sec.size)) == (["sm_80"], [])
    ptx = open_elf(cuda_elfs["ptx90"])
    sec = ptx.sections[".nv_fatbin"]
    assert arch_sets(parse_fatbin(ptx._map, sec.offset, sec.offset + sec.size)) == ([], ["compute_90"])


def test_missing_promised_arch_is_an_error(cuda_elfs):
    assert audit_target(cuda_elfs["sm80"], archs=["sm_80"]).ok
    report = audit_target(cuda_elfs["sm80"], archs=["sm_80", "sm_90"])
    (finding,) = _errors(report, "gpu")
    assert finding.arch == "sm_90" and "has sm_80" in finding.message
    assert report.sass_archs == ["sm_80"]


def test_ptx_only_is_a_warning(cuda_elfs):
    report = audit_target(cuda_elfs["ptx90"], archs=["sm_90"])
    assert report.ok
    (warning,) = [f for f in report.warnings if f.check == "gpu"]
    assert warning.arch == "sm_90" and "only by PTX" in warning.message
    assert report.ptx_archs == ["compute_90"] and report.sass_archs == []
    # PTX for compute_90 cannot serve an older GPU.
    assert not audit_target(cuda_elfs["ptx90"], archs=["sm_80"]).ok



def test_libpython_of_a_venv_target_is_found_in_its_base_python(tmp_path):
    """A module linked against libpython (as our builds link, -Wl,--no-undefined), audited
    against a venv: the library lives in the venv's base python, which loads it at import.
    A made-up libpython3.99 keeps the system's own libpython out of the answer."""
    import subprocess

    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    (base / "lib").mkdir()
    (tmp_path / "py.c").write_text("int Py_Stand_In(void) { return 3; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libpython3.99.so.1.0", "-o",
                    str(base / "lib" / "libpython3.99.so.1.0"), str(tmp_path / "py.c")], check=True)
    (base / "bin" / "python3.99").write_bytes(Path("/bin/true").read_bytes())
    (tmp_path / "ext.c").write_text("int Py_Stand_In(void);\nint ext_entry(void) { return Py_Stand_In(); }\n")
    so = tmp_path / "ext.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(tmp_path / "ext.c"), f"-L{base / 'lib'}",
                    "-Wl,--no-undefined", "-l:libpython3.99.so.1.0"], check=True)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(base / "bin" / "python3.99")
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\n")

    report = audit_target(so, against=venv)
    assert report.ok, report.render()
    assert report.modules[0].unresolved == 0
    with pytest.raises(ExtforgeError, match="is neither a venv"):  # its bin/ folder is no environment
        audit_target(so, against=tmp_path / "venv" / "bin")


def test_a_static_libstdcxx_exported_by_the_module_is_an_error(elfs):
    """A g++ that only has libstdc++.a (or -static-libstdc++) puts a 2nd C++ runtime in the process."""
    report = audit_target(elfs["static_runtime"])
    (finding,) = _errors(report, "abi")
    assert "carries its own C++ runtime" in finding.message and finding.library == "libstdc++.so.6"
    assert finding.symbol in {"std::locale::classic()", "std::terminate()", "std::exception::~exception()"}
    # The runtime's own dual-ABI instantiations are not taken for the module's string ABI.
    assert not report.warnings and report.modules[0].cxx11_abi is True

    shared = audit_target(elfs["shared_runtime"])
    assert shared.ok and not shared.warnings, shared.render()
    assert "libstdc++.so.6" in shared.modules[0].needed


# Exported by torch 2.6.0+cu124's libc10.so (the pip wheel, old C++ ABI): its own API with the
# old std::string (`Ss`), next to libstdc++'s own instantiations of the new one.
LIBC10_2_6_0 = [
    "_ZN3c1011LogAPIUsageERKSs",
    "_ZNSt10_HashtableISsSt4pairIKSsN3c1011DispatchKeyEESaIS4_ENSt8__detail10_Select1stESt8equal_toISsESt4hashISsENS6_18_Mod_range_hashingENS6_20_Default_ranged_hashENS6_20_Prime_rehash_policyENS6_17_Hashtable_traitsILb1ELb0ELb1EEEEC2IPKS4_EET_SL_mRKSB_RKSC_RKSD_RKS9_RKS7_RKS5_",
    "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE6appendERKS4_",
    "_ZGTtNSt16invalid_argumentC2ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZGTtNSt13runtime_errorC1ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
]


def test_an_old_abi_torch_library_is_read_as_old_abi_despite_libstdcxx_names():
    from extforge.audit.abi import abi_evidence
    from extforge.audit.checks import library_abi

    assert abi_evidence(LIBC10_2_6_0).cxx11_abi is None  # taken whole: mixed, "unknown"
    assert library_abi(LIBC10_2_6_0) is False
    assert library_abi(["_ZN3c1011LogAPIUsageERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
                        *LIBC10_2_6_0[2:]]) is True
