"""Every change extforge makes on disk goes through safe_files (no link followed, no FIFO
opened, deletes and chmods relative to a folder descriptor), so the class of bug where a
planted link redirects a delete, chmod or write cannot come back in new code: a raw write,
delete, chmod, rename or rmtree anywhere else in src/ fails this test, unless ALLOWED names the
function with the reason it is safe there."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "extforge"
LAYER = "safe_files.py"

OS_CHANGES = {"remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "chmod", "lchmod", "chown",
              "lchown", "truncate", "link", "symlink", "mkdir", "makedirs", "mkfifo", "mknod", "utime"}
SHUTIL_CHANGES = {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copymode", "copystat", "chown"}
# Path's, and tarfile's and zipfile's extract (files written where the archive says).
PATH_CHANGES = {"unlink", "rmdir", "chmod", "lchmod", "rename", "write_text", "write_bytes", "touch", "symlink_to",
                "hardlink_to", "mkdir", "extract", "extractall"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}

# Folders only this process can write (a mkdtemp folder, 0700), files inside a tar/zip stream,
# or the tool's own work tree under a private scratch folder: a planted link cannot be there.
SCRATCH = "writes only inside a scratch folder this process made (tempfile.mkdtemp / paths.scratch_dir: 0700, its own)"
MIRROR = ("builds upstream packages in the caller's own mirror work folders before they are published; "
          "not a folder other users write (docs/site-admin.md: the mirror is built by one admin)")

OTHERS = "not yet moved onto the layer (issue #38 follow-up); "
ALLOWED: dict[str, str] = {
    "cli.py::_run": "opens /dev/null to stand in for a closed stdout",
    "audit/packaging.py::_extract_members": SCRATCH + "; members checked by archive.py's budget and tar's data filter first",
    "audit/packaging.py::_extract_wheel": SCRATCH + "; member names checked by archive.unsafe_reason first",
    "environment/trust.py::_secret": "inside the private trust folder trust_dir checked (0700, the user's own)",
    "environment/trust.py::write_signed": "inside the private trust folder trust_dir checked (0700, the user's own)",
    "wheel/make.py::_extract": SCRATCH + "; members checked by archive.py's path rule and budget and tar's data filter first",
    "wheel/make.py::write_zip": "writes members of a zip stream (the wheel safe_files.atomic_writer opened), not files",
    "wheel/make.py::_relink": SCRATCH + " (the package's files extracted there, made writable for patchelf)",
    "stamp.py::_stamp_conda": "writes members of a zip stream, not files",
    "stamp.py::stamp_package": "writes tar members into the stream safe_files.atomic_writer opened",
    "recipes/sources.py::_from_folders": OTHERS + "recipes/sources.py is changed by another branch",
    "recipes/sources.py::fetch": OTHERS + "recipes/sources.py is changed by another branch",
    "mirror/__init__.py::build_mirror": MIRROR,
    "mirror/_stage.py::_write": MIRROR,
    "mirror/_stage.py::main": MIRROR,
    "mirror/builder.py::_build_miss": MIRROR,
    "mirror/builder.py::_build_with_rattler": MIRROR,
    "mirror/conda_writer.py::_tar_zst": "writes a member of a zip stream, not a file",
    "mirror/conda_writer.py::_compiled": MIRROR + "; the package's modules staged for its python to compile",
    "mirror/conda_writer.py::write_package": MIRROR,
    "mirror/builder.py::seed_records": MIRROR,
    "mirror/builder.py::place": MIRROR,
    "mirror/cuda_sources.py::_cached_tree": MIRROR,
    "mirror/cuda_sources.py::from_wheels.build": MIRROR,
    "mirror/cuda_sources.py::from_wheels": MIRROR,
    "mirror/cuda_sources.py::Apt.update": MIRROR,
    "mirror/cuda_sources.py::_unpack_deb": MIRROR,
    "mirror/cuda_sources.py::add_wheel_headers.build": MIRROR,
    "mirror/hashing.py::sha256_file": MIRROR,
    "mirror/inputs.py::share_wheels": MIRROR,
    "mirror/inputs.py::_link_verified": MIRROR + "; links a file of this user's, hashed, from a folder only this user can write",
    "mirror/inputs.py::_own_request_folder": MIRROR + "; the download folder, refused unless this user's alone",
    "mirror/inputs.py::drop_unchosen": MIRROR,
    "mirror/inputs.py::from_pip": MIRROR,
}


def _mode_writes(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) <= 8
            and set(node.value) <= set("rwxabt+|:gzb2") and bool(set(node.value) & set("wax+")))


def _raw_change(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        modes = call.args[1:2] + [k.value for k in call.keywords if k.arg == "mode"]
        return "open for writing" if any(_mode_writes(m) for m in modes) else None
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner == "safe_files":
        return None
    if owner == "os" and func.attr == "open":
        flags = {n.attr for n in ast.walk(call.args[1]) if isinstance(n, ast.Attribute)} if len(call.args) > 1 else set()
        return "os.open for writing" if flags & WRITE_FLAGS else None
    if owner == "os":
        return f"os.{func.attr}" if func.attr in OS_CHANGES else None
    if owner == "shutil":
        return f"shutil.{func.attr}" if func.attr in SHUTIL_CHANGES else None
    if func.attr in PATH_CHANGES:
        return f".{func.attr}()"
    if func.attr == "replace" and len(call.args) == 1 and not call.keywords:  # Path.replace, not str.replace(a, b)
        return ".replace()"
    if func.attr == "open":
        modes = call.args[:2] + [k.value for k in call.keywords if k.arg == "mode"]
        return ".open for writing" if any(_mode_writes(m) for m in modes) else None
    return None


def raw_changes(tree: ast.AST, classify: Callable[[ast.Call], str | None] = _raw_change) -> list[tuple[str, int, str]]:
    """(enclosing function's qualified name, line, what) of each call `classify` names in a module."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Call) and (what := classify(child)):
                found.append((where or "<module>", child.lineno, what))
            visit(child, where)

    visit(tree, "")
    return found


def check_calls(paths: Iterable[Path], classify: Callable[[ast.Call], str | None], allowed: Mapping[str, str],
                fix: str) -> None:
    """Fail on each call `classify` names in `paths` whose function `allowed` does not list, and on
    an entry of `allowed` that names no such function any more."""
    found: dict[str, list[str]] = {}
    for path in paths:
        rel = path.relative_to(SRC).as_posix()
        for where, line, what in raw_changes(ast.parse(path.read_text(), str(path)), classify):
            found.setdefault(f"{rel}::{where}", []).append(f"{rel}:{line}: {what}")
    raw = [hit for place, hits in found.items() if place not in allowed for hit in hits]
    assert not raw, f"{fix}:\n" + "\n".join(raw)
    assert all(reason.strip() for reason in allowed.values()), "every exception says why it is safe"
    stale = sorted(set(allowed) - set(found))
    assert not stale, f"ALLOWED names functions that no longer make such a call: {stale}"


def test_no_raw_disk_change_outside_the_layer() -> None:
    # data/ holds scripts that run inside a build env (the build layer's), not extforge's code.
    paths = [p for p in sorted(SRC.rglob("*.py"))
             if not (p.name == LAYER and p.parent == SRC or "data" in p.relative_to(SRC).parts)]
    check_calls(paths, _raw_change, ALLOWED, "change these through extforge.safe_files (or add the function to ALLOWED "
                "with the reason no one else can write there)")


def test_the_check_catches_each_kind_of_raw_change() -> None:
    code = """
def f(p, d):
    p.write_text("x"); p.unlink(); p.chmod(0o644); p.replace(d); os.rename(p, d); shutil.rmtree(d)
    open(p, "w"); p.open("ab"); os.open(p, os.O_WRONLY | os.O_CREAT); os.symlink(p, d); p.mkdir(); tar.extract(m, d)
    "a-b".replace("-", "_"); open(p); p.open("rb"); os.open(p, os.O_RDONLY); dataclasses.replace(p, x=1)
"""
    whats = [what for _, _, what in raw_changes(ast.parse(code))]
    assert whats == [".write_text()", ".unlink()", ".chmod()", ".replace()", "os.rename", "shutil.rmtree",
                     "open for writing", ".open for writing", "os.open for writing", "os.symlink", ".mkdir()", ".extract()"]
