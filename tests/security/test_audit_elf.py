"""The audit refuses what it cannot vouch for: machine code for another platform, modules whose
sections it cannot read, and library search paths that lead outside the prefix. Every module
here is compiled by g++ and then, where a case needs it, patched byte by byte; each case runs the
real `extforge audit` and asserts the refusal, its exit code and no traceback (the sandbox).

No aarch64 cross compiler is installed on the development machine: the aarch64 module is a
real x86-64 g++ module with its e_machine patched to EM_AARCH64 (183), which is exactly what
the audit reads. The 32-bit module is real: `gcc -m32 -nostdlib`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from .crafted import Member, craft_package, craft_wheel, gxx_so

EXT_NAME = "ext.cpython-311-x86_64-linux-gnu.so"
SITE = "lib/python3.11/site-packages"
EM_AARCH64 = 183
# A build prefix as conda-build and rattler-build write it into binaries they record for relocation.
PLACEHOLDER = "/opt/conda-bld/ext_1700000000/_h_env_placehold_placehold_placehold_placehold"

# A stand-in for torch's libc10: the audited module calls c10_op(); a crafted copy elsewhere
# also defines c10_extra(), which the target's libc10 does not.
C10 = 'extern "C" int c10_op(int x) { return x + 1; }\n'
C10_EXTRA = C10 + 'extern "C" int c10_extra(int x) { return x * 2; }\n'
USES_EXTRA = 'extern "C" int c10_op(int); extern "C" int c10_extra(int);\nextern "C" int f(int x) { return c10_op(x) + c10_extra(x); }\n'


def _patch(path: Path, offset: int, fmt: str, *values: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    path.write_bytes(bytes(data))
    return path


def _section(path: Path, name: str) -> tuple[int, int]:
    """(index, header offset) of a section, read with pyelftools from the real file."""
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == name)
        return index, elf["e_shoff"] + index * elf["e_shentsize"]


def _section_offset(path: Path, name: str) -> int:
    with path.open("rb") as fh:
        return ELFFile(fh).get_section_by_name(name)["sh_offset"]


def _copy(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audit-elf")
    out = {"plain": gxx_so(root, "plain.so")}
    out["aarch64"] = _patch(_copy(out["plain"], root / "aarch64.so"), 18, "<H", EM_AARCH64)
    src = root / "i386.c"
    src.write_text("int f(int x) { return x + 1; }\n")
    subprocess.run(["gcc", "-m32", "-nostdlib", "-shared", "-fPIC", "-o", str(root / "i386.so"), str(src)], check=True)
    out["i386"] = root / "i386.so"
    # No section headers: the loader does not need them (sstrip makes such files), the audit does.
    out["no-sections"] = _patch(_copy(out["plain"], root / "no-sections.so"), 0x28, "<Q", 0)
    _patch(out["no-sections"], 0x3C, "<HH", 0, 0)
    # Cut before the section header table: a download that stopped early.
    data = out["plain"].read_bytes()
    (root / "truncated.so").write_bytes(data[: len(data) * 2 // 3])
    out["truncated"] = root / "truncated.so"
    # Headers intact, but .dynsym claims to run far past the end of the file.
    out["section-past-end"] = _copy(out["plain"], root / "section-past-end.so")
    _patch(out["section-past-end"], _section(out["plain"], ".dynsym")[1] + 0x20, "<Q", 24 << 26)  # a whole number of symbols, as pyelftools checks
    # The .dynamic section header points at .dynsym while PT_DYNAMIC (what the loader reads) stays.
    out["dynamic-moved"] = _copy(out["plain"], root / "dynamic-moved.so")
    _patch(out["dynamic-moved"], _section(out["plain"], ".dynamic")[1] + 0x18, "<Q", _section_offset(out["plain"], ".dynsym"))

    for name, flags in {
        "runpath-build": ["-Wl,-rpath,/home/builder/torch/lib"],
        "rpath-build": ["-Wl,--disable-new-dtags", "-Wl,-rpath,/home/builder/torch/lib"],
        "runpath-tmp": ["-Wl,-rpath,/tmp/extforge-libs"],
        "runpath-relative": ["-Wl,-rpath,lib"],
        "runpath-empty": ["-Wl,-rpath,$ORIGIN::"],
        "runpath-escape": ["-Wl,-rpath,$ORIGIN/../../../../../outside/lib"],
        "runpath-origin": ["-Wl,-rpath,$ORIGIN/../.."],
        "runpath-system": ["-Wl,-rpath,/usr/lib/x86_64-linux-gnu"],
        "runpath-placeholder": [f"-Wl,-rpath,{PLACEHOLDER}/lib"],
    }.items():
        out[name] = gxx_so(root, f"{name}.so", 'extern "C" int f(int x) { return x + 1; }\n', *flags)
    return out


def _ext_package(sandbox, so: Path, subdir: str = "linux-64", fmt: str = "conda") -> Path:
    members = [Member(f"{SITE}/{EXT_NAME}", so.read_bytes(), mode=0o755), Member(f"{SITE}/ext.py", b"")]
    return craft_package(sandbox.path("in"), "ext", members, subdir=subdir, fmt=fmt)


def _audit(sandbox, target: Path, *args: str, expect: int) -> dict:
    with sandbox.unchanged_outside():
        res = sandbox.run("audit", str(target), "--json", *args, expect=expect)
    return json.loads(res.stdout)


def _messages(report: dict, severity: str = "error") -> list[str]:
    return [f["message"] for f in report["findings"] if f["severity"] == severity]


# --- machine and class -----------------------------------------------------------------------

def test_plain_module_passes(sandbox, built):
    """The control: the same module, unpatched, passes bare, in a package and in a wheel."""
    assert _audit(sandbox, built["plain"], expect=0)["verdict"] == "pass"
    assert _audit(sandbox, _ext_package(sandbox, built["plain"]), expect=0)["verdict"] == "pass"
    wheel = craft_wheel(sandbox.path("in"), "ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                        {f"ext/{EXT_NAME}": built["plain"].read_bytes(), "ext/__init__.py": b""})
    assert _audit(sandbox, wheel, expect=0)["verdict"] == "pass"


def test_aarch64_module_is_refused_for_linux_64(sandbox, built):
    report = _audit(sandbox, built["aarch64"], expect=1)
    assert any("aarch64 (64-bit, little-endian) code; linux-64 runs x86-64" in m for m in _messages(report))
    report = _audit(sandbox, _ext_package(sandbox, built["aarch64"]), expect=1)
    assert any(m.startswith(f"{SITE}/{EXT_NAME} is aarch64") for m in _messages(report))


def test_x86_64_module_in_an_aarch64_package_or_wheel_is_refused(sandbox, built):
    report = _audit(sandbox, _ext_package(sandbox, built["plain"], subdir="linux-aarch64"), expect=1)
    assert any("x86-64 (64-bit, little-endian) code; linux-aarch64 runs aarch64" in m for m in _messages(report))
    wheel = craft_wheel(sandbox.path("in"), "ext-1.0-cp311-cp311-manylinux_2_28_aarch64.whl",
                        {f"ext/{EXT_NAME}": built["plain"].read_bytes(), "ext/__init__.py": b""})
    report = _audit(sandbox, wheel, expect=1)
    assert any("linux-aarch64 runs aarch64" in m for m in _messages(report))


def test_32_bit_module_is_refused_for_linux_64(sandbox, built):
    report = _audit(sandbox, built["i386"], expect=1)
    assert any("i386 (32-bit, little-endian) code; linux-64 runs x86-64 (64-bit" in m for m in _messages(report))


def test_machine_code_in_a_noarch_package_is_refused(sandbox, built):
    report = _audit(sandbox, _ext_package(sandbox, built["plain"], subdir="noarch"), expect=1)
    assert any("noarch package but ships machine code" in m for m in _messages(report))


# --- modules the audit cannot read: exit 2, never a pass -----------------------------------------

UNREADABLE = {
    "no-sections": "it has no section headers",
    "truncated": "could not audit",
    "section-past-end": "section .dynsym ends at byte",
    "dynamic-moved": "the loader reads its dynamic table at byte",
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
@pytest.mark.parametrize("form", ["so", "conda", "tar.bz2"])
def test_unreadable_module_cannot_be_audited(sandbox, built, case, form):
    target = built[case] if form == "so" else _ext_package(sandbox, built[case], fmt=form)
    with sandbox.unchanged_outside():
        res = sandbox.run("audit", str(target))
    res.refused("could not audit", UNREADABLE[case], code=2)
    assert "pass" not in res.output.split()


def test_library_of_the_package_with_a_crafted_hash_table_cannot_be_audited(sandbox):
    """Symbols are looked up through the GNU hash table of each library the module loads; one with
    zero buckets (crafted) cannot be followed."""
    lib = gxx_so(sandbox.path("build"), "libown.so", C10, "-Wl,-soname,libown.so", "-Wl,--hash-style=gnu")
    module = gxx_so(sandbox.path("build"), "ext.so", 'extern "C" int c10_op(int);\nint g(int x) { return c10_op(x); }\n',
                    f"-L{lib.parent}", "-lown", "-Wl,-rpath,$ORIGIN")
    _patch(lib, _section_offset(lib, ".gnu.hash"), "<I", 0)
    members = [Member(f"{SITE}/{EXT_NAME}", module.read_bytes(), mode=0o755),
               Member(f"{SITE}/libown.so", lib.read_bytes(), mode=0o755)]
    pkg = craft_package(sandbox.path("in"), "ext", members, subdir="linux-64")
    res = sandbox.run("audit", str(pkg))
    res.refused("could not audit", "libown.so", "GNU hash table", code=2)


def test_unreadable_module_blocks_publish(sandbox, built):
    pkg = _ext_package(sandbox, built["no-sections"])
    channel = sandbox.root / "ch"
    with sandbox.unchanged_outside(channel):
        res = sandbox.run("publish", str(pkg), "--channel", str(channel))
    res.refused("could not audit", "no section headers", code=2)
    assert not list(channel.glob("*/*.conda"))


# --- RPATH / RUNPATH ---------------------------------------------------------------------------

SEARCH_PATHS = {
    # case: (what the finding says, the entry it names)
    "runpath-build": ("RUNPATH '/home/builder/torch/lib' is an absolute folder outside the prefix", "/home/builder"),
    "rpath-build": ("RPATH '/home/builder/torch/lib' is an absolute folder outside the prefix", "/home/builder"),
    "runpath-tmp": ("RUNPATH '/tmp/extforge-libs' is a world-writable folder", "/tmp/extforge-libs"),
    "runpath-relative": ("RUNPATH 'lib' is relative to the working directory", "'lib'"),
    "runpath-empty": ("RUNPATH '' (an empty entry) is relative to the working directory", "empty"),
    "runpath-escape": ("is a $ORIGIN path leading outside the prefix", "outside/lib"),
}


@pytest.mark.parametrize("case", sorted(SEARCH_PATHS))
def test_search_path_outside_the_prefix_is_an_error(sandbox, built, case):
    message, needle = SEARCH_PATHS[case]
    report = _audit(sandbox, _ext_package(sandbox, built[case]), expect=1)
    errors = [m for m in _messages(report) if "RPATH" in m or "RUNPATH" in m]
    assert any(message in m and needle in m for m in errors), errors


def test_search_path_inside_the_prefix_passes_and_a_system_one_warns(sandbox, built):
    # $ORIGIN/../.. from lib/python3.11/site-packages is the prefix's lib folder.
    assert _audit(sandbox, _ext_package(sandbox, built["runpath-origin"]), expect=0)["verdict"] == "pass"
    report = _audit(sandbox, _ext_package(sandbox, built["runpath-system"]), expect=0)
    assert any("is a system folder" in m for m in _messages(report, "warning"))


def test_absolute_runpath_at_the_prefix_placeholder_is_the_prefix(sandbox, built):
    """A build prefix the package records in paths.json as a binary placeholder becomes the install
    prefix at install time: inside the prefix. Unrecorded, the same path is a build machine's."""
    data = built["runpath-placeholder"].read_bytes()
    entry = {"_path": f"{SITE}/{EXT_NAME}", "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
             "size_in_bytes": len(data), "file_mode": "binary", "prefix_placeholder": PLACEHOLDER}
    members = [Member(f"{SITE}/{EXT_NAME}", data, mode=0o755)]
    pkg = craft_package(sandbox.path("in"), "ext", members, subdir="linux-64", paths=[entry])
    assert _audit(sandbox, pkg, expect=0)["verdict"] == "pass"
    report = _audit(sandbox, _ext_package(sandbox, built["runpath-placeholder"]), expect=1)
    assert any(f"RUNPATH '{PLACEHOLDER}/lib' is an absolute folder outside the prefix" in m for m in _messages(report))


def test_world_writable_folder_inside_an_installed_prefix_is_an_error(sandbox, built):
    prefix = sandbox.path("env")
    (prefix / "conda-meta").mkdir()
    _copy(built["runpath-origin"], prefix / SITE / EXT_NAME)
    assert _audit(sandbox, prefix, expect=0)["verdict"] == "pass"
    (prefix / "lib").chmod(0o777)
    try:
        report = _audit(sandbox, prefix, expect=1)
    finally:
        (prefix / "lib").chmod(0o755)
    assert any("RUNPATH '$ORIGIN/../..' is a world-writable folder" in m and str(prefix / "lib") in m
               for m in _messages(report))


# --- resolution in the loader's order at the user's site (issue 18) ------------------------------

@pytest.fixture
def planted(sandbox) -> dict[str, Path]:
    """A builder's torch/lib that exists on the auditing machine, with a libc10.so that defines one
    symbol more than the target's; the module was linked against it and points its RUNPATH there."""
    builder = sandbox.path("home", "builder", "torch", "lib")
    gxx_so(builder, "libc10.so", C10_EXTRA, "-Wl,-soname,libc10.so")
    target_lib = sandbox.path("target", "torch", "lib")
    gxx_so(target_lib, "libc10.so", C10, "-Wl,-soname,libc10.so")
    (target_lib.parent / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")
    module = gxx_so(sandbox.path("in"), "ext.so", USES_EXTRA, f"-L{builder}", "-lc10", f"-Wl,-rpath,{builder}")
    return {"builder": builder, "target": target_lib.parent.parent, "torch_lib": target_lib, "module": module}


@pytest.mark.parametrize("against", ["torch_lib", "target"])
def test_absolute_runpath_folder_on_the_auditing_machine_is_never_searched(sandbox, planted, against):
    report = _audit(sandbox, planted["module"], "--against", str(planted[against]), expect=1)
    errors = _messages(report)
    assert any("unresolved c10_extra" in m for m in errors), errors
    assert any(f"RUNPATH '{planted['builder']}'" in m for m in errors), errors
    (module,) = report["modules"]
    assert module["unresolved"] == 1


def test_absolute_runpath_without_a_target_finds_no_library(sandbox, planted):
    report = _audit(sandbox, planted["module"], expect=1)
    assert any("libc10.so (needed by ext.so) is not found" in m for m in _messages(report))


def test_the_loaded_torch_is_matched_by_soname_before_any_search_path(sandbox, planted):
    """Even a search path inside the audited folder loses to the libc10.so `import torch` loaded."""
    local = gxx_so(sandbox.path("in", "lib"), "libc10.so", C10_EXTRA, "-Wl,-soname,libc10.so")
    module = gxx_so(sandbox.path("in"), "ext_local.so", USES_EXTRA, f"-L{local.parent}", "-lc10", "-Wl,-rpath,$ORIGIN/lib")
    assert _audit(sandbox, module, "--against", str(local.parent), expect=0)["verdict"] == "pass"
    report = _audit(sandbox, module, "--against", str(planted["target"]), expect=1)
    assert any("unresolved c10_extra" in m for m in _messages(report))


def test_needed_by_absolute_path_is_refused(sandbox, planted):
    lib = gxx_so(sandbox.path("abs"), "libpath.so", C10)  # no soname: the link records the path
    module = gxx_so(sandbox.path("in"), "ext_path.so", 'extern "C" int c10_op(int);\nint g(int x) { return c10_op(x); }\n',
                    str(lib))
    report = _audit(sandbox, module, "--against", str(planted["target"]), expect=1)
    errors = _messages(report)
    assert any(f"NEEDED '{lib}' is" in m for m in errors), errors
    assert any(f"{lib} (needed by ext_path.so) is not found" in m for m in errors), errors
    assert os.path.exists(lib)


@pytest.mark.parametrize("entry, placeholder, verdict", [
    ("$ORIGIN/../lib", None, "origin"),
    ("${ORIGIN}/../../lib", None, "origin"),
    ("$ORIGINAL/lib", None, "cwd"),  # not the $ORIGIN token: relative, as for the loader
    ("$LIB/x", None, "cwd"),
    ("$ORIGIN/../../../..", None, "escapes"),
    (f"{PLACEHOLDER}/lib", PLACEHOLDER, "prefix"),
    ("/home/builder/torch/lib", "/", "absolute"),  # "/" as placeholder does not make everything the prefix
    ("/var/tmp/x", None, "world-writable"),
    ("/usr/lib64", None, "system"),
])
def test_search_path_verdicts(entry, placeholder, verdict):
    from extforge.audit.search_paths import judge, placement

    where = placement("conda", f"{SITE}/{EXT_NAME}", Path("/unused"), None, placeholder)
    assert judge(entry, where)[0] == verdict
