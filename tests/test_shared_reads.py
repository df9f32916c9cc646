"""Every file the planning and build path reads from a place another user may write (a shared
cost store, a recipe's build-costs.json, the notes and logs of an output folder) goes through
extforge.shared_read: a regular file of bounded size, bounded JSON, typed values. The class of bug
where a planted FIFO hangs `plan`, a link to /dev/zero fills memory, deep JSON crashes it or a unit
name reaches a shell cannot come back in these modules: a read any other way (open, read_text,
read_bytes, json.load(s), a YAML load, os.open, safe_files.read_bytes) fails this test, unless
ALLOWED names the function with the reason what it reads is no shared place."""

from __future__ import annotations

import ast

from test_disk_layer import SRC, check_calls, raw_changes

# The planning and build path, the mirror's download folders and a Slurm build's state and job files. Other readers of shared places
# are not converted yet and are named in docs/architecture.md ("Files other people write, read"):
# recipes/scaffold.py and recipes/sources.py (recipe new, the source cache), cache.py, channel/.
MODULES = ("planning/cost_store.py", "planning/unit_costs.py", "planning/plan.py", "building/parts.py", "building/build.py", "compile_cache.py", "recipes/build_layer.py",
           "commands/plan.py", "commands/build.py", "mirror/inputs.py", "slurm/state.py", "slurm/submit.py")

PACKAGE_DATA = "extforge's own package data (importlib.resources), installed with extforge: no other user writes it"
RECIPE = ("the recipe the user names to build or plan: its build script runs as them anyway; the data a recipe folder "
          "ships (build-costs.json) is read through shared_read")
CHECKED_COPY = ("the build's copy of the recipe folder in its private work folder, made as recipes.trust checked that "
                "nobody but the builder and root may write the folder, what is in it and above it")
ALLOWED: dict[str, str] = {
    "planning/plan.py::default_profile": PACKAGE_DATA,
    "recipes/build_layer.py::_data": PACKAGE_DATA,
    "recipes/build_layer.py::switches": PACKAGE_DATA,
    "recipes/build_layer.py::layer_files": PACKAGE_DATA,
    "planning/cost_store.py::_literal": RECIPE,
    "planning/cost_store.py::_recipe_text": RECIPE,
    "building/build.py::_build_recipe": CHECKED_COPY,
    "commands/plan.py::recipe_facts": RECIPE,
    "commands/plan.py::recipe_name": RECIPE,
    "compile_cache.py::_umask": "/proc/self/status: the kernel's account of this process, which no user writes",
    "mirror/inputs.py::probe": "the JSON a python the user named prints on its stdout: no file",
    "mirror/inputs.py::_open_own": ("opens without following a link or waiting on a FIFO, and keeps the descriptor of a "
                                    "regular file or folder of this user's that nobody else may write alone"),
    "mirror/inputs.py::_sha256_of": "hashes a wheel through a descriptor opened and checked as above, never parsed",
    "mirror/inputs.py::_record_download": ("the wheels pip just wrote into this user's own download folder: opened "
                                           "without following a link, refused unless this user's, only hashed"),
}

READ_ATTRS = {"read_text", "read_bytes"}
PARSERS = {("json", "load"), ("json", "loads"), ("pickle", "load"), ("pickle", "loads"), ("tomllib", "load"),
           ("tomllib", "loads"), ("yaml", "load"), ("yaml", "safe_load"), ("os", "read"), ("os", "fdopen"),
           ("safe_files", "read_bytes")}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def _writes(mode: ast.expr) -> bool:
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax+"))


def _raw_read(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        modes = call.args[1:2] + [k.value for k in call.keywords if k.arg == "mode"]
        return None if any(_writes(m) for m in modes) else "open()"
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner == "shared_read":
        return None
    if (owner, func.attr) in PARSERS:
        return f"{owner}.{func.attr}"
    if owner == "os" and func.attr == "open":
        flags = {n.attr for n in ast.walk(call.args[1]) if isinstance(n, ast.Attribute)} if len(call.args) > 1 else set()
        return None if flags & WRITE_FLAGS else "os.open"
    if func.attr in READ_ATTRS:
        return f".{func.attr}()"
    if func.attr == "open" and owner != "os":
        modes = call.args[:1] + [k.value for k in call.keywords if k.arg == "mode"]
        return None if any(_writes(m) for m in modes) else ".open()"
    if func.attr == "load" and isinstance(func.value, ast.Call):  # YAML(typ="safe").load(text)
        return "a parser's .load()"
    return None


def test_the_planning_and_build_path_reads_shared_places_only_through_shared_read() -> None:
    check_calls([SRC / rel for rel in MODULES], _raw_read, ALLOWED, "read these through extforge.shared_read (or add the "
                "function to ALLOWED with the reason what it reads is no place another user may write)")


def test_the_check_catches_each_kind_of_raw_read() -> None:
    code = """
def f(p, fd):
    open(p); p.read_text(); p.read_bytes(); p.open(); p.open("rb"); json.loads(t); json.load(fh)
    os.open(p, os.O_RDONLY); os.read(fd, 9); safe_files.read_bytes(p, limit=9); YAML(typ="safe").load(t)
    open(p, "w"); p.open("a"); os.open(p, os.O_WRONLY | os.O_CREAT); shared_read.read_text(p, limit=9)
    cost_store.load("x"); shared_read.parse_json(t, "x")
"""
    whats = [what for _, _, what in raw_changes(ast.parse(code), _raw_read)]
    assert whats == ["open()", ".read_text()", ".read_bytes()", ".open()", ".open()", "json.loads", "json.load", "os.open",
                     "os.read", "safe_files.read_bytes", "a parser's .load()"]
