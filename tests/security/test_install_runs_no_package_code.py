"""Install byte-compiles with an interpreter it placed itself from the python package's verified
files, never with a program another package of the environment put there: a package that ships
the interpreter's own path is refused naming it, one that shadows a standard module the compile
step imports is never run, and verify fails an environment whose python is another package's."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from extforge.publishing.index import reindex

from .crafted import craft_package, member

MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"


def _channel(sandbox, mirror_python: Path, evil: list) -> Path:
    """The channel "internal": the mirror's python, and `evil` (which needs it) with these members."""
    channel = sandbox.path("ch")
    (channel / "linux-64").mkdir(exist_ok=True)
    shutil.copy(mirror_python, channel / "linux-64")
    craft_package(channel / "linux-64", "evil", evil, subdir="linux-64", index={"depends": ["python"]})
    reindex(channel)
    return channel


def _planted(marker: Path) -> bytes:
    return f"#!/bin/sh\necho ran > {marker}\n".encode()


def test_a_package_shipping_the_interpreters_path_is_refused_and_never_run(sandbox, mirror_python):
    """The old install ran the env's bin/python, which another package of the lock had replaced
    (it ships bin/pythonX.Y too, and rattler kept its copy): its code ran as the installing user
    (root on a site), and verify then passed the environment."""
    marker = sandbox.root / "planted-python-ran"
    interpreter = f"bin/python{MINOR}"
    lock = sandbox.lock(_channel(sandbox, mirror_python, [member(interpreter, _planted(marker), mode=0o755)]), "evil")
    prefix = sandbox.root / "envs" / "p"
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=1)
    res.refused(f"evil ships {interpreter}", "python")
    assert not marker.exists()
    assert not prefix.exists()


@pytest.mark.parametrize("shadow", ["py_compile/__init__.py", "encodings/aliases/__init__.py"])
def test_a_standard_module_another_package_shadows_never_runs_at_install(sandbox, mirror_python, shadow):
    """A package may put any file beside the standard library (no file of python's is touched):
    `lib/python3.X/py_compile/__init__.py`, a package that Python imports before py_compile.py, or
    `encodings/aliases/__init__.py`, imported in place of encodings/aliases.py as Python starts.
    The old install ran the env's own interpreter, which imported the first while byte-compiling.
    The second lies in a folder otherwise python's alone: install links such a folder whole into
    the interpreter's place (not a hard link per file), and one linked without looking for other
    packages' files in it would run it."""
    marker = sandbox.root / "shadow-ran"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\naliases = {{}}\n".encode()
    lock = sandbox.lock(_channel(sandbox, mirror_python, [member(f"lib/python{MINOR}/{shadow}", code)]), "evil")
    prefix = sandbox.root / "envs" / "p"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert not marker.exists()
    record = json.loads((prefix.parent / f".{prefix.name}.extforge-install.json").read_text())
    folder = shadow.removesuffix("/__init__.py")
    assert f"lib/python{MINOR}/{folder}/__pycache__/__init__.cpython-{MINOR.replace('.', '')}.pyc" in record["written"]
    assert not (prefix / ".extforge").exists()  # the interpreter's folder went with the staging folder
    sandbox.run("verify", str(prefix), "--rehash", expect=0)


def _install_as_rattler_does(lock: Path, channel: Path, prefix: Path, cache: Path) -> None:
    """The environment as rattler (pixi's installer) installs the lock, with no check of extforge's."""
    import asyncio

    from rattler import install

    from extforge.environment.packages import locked_records

    records = locked_records(lock, "default")
    origin = {}
    for r in records:
        origin[r.file_name] = (r.url, r.channel)
        r.url = (channel / r.subdir / r.file_name).as_uri()
    asyncio.run(install(records, prefix, cache_dir=cache, execute_link_scripts=False, show_progress=False))
    for meta in (prefix / "conda-meta").glob("*.json"):
        record = json.loads(meta.read_text())
        record["url"], record["channel"] = origin[record["fn"]]
        meta.write_text(json.dumps(record))


def test_verify_fails_an_environment_whose_python_is_another_packages_file(sandbox, mirror_python):
    """The old verify took a path several packages ship to hold any one's copy, the interpreter's
    too: an environment whose bin/pythonX.Y was another package's passed."""
    marker = sandbox.root / "planted-python-ran"
    interpreter = f"bin/python{MINOR}"
    channel = _channel(sandbox, mirror_python, [member(interpreter, _planted(marker), mode=0o755)])
    lock = sandbox.lock(channel, "evil")
    prefix = sandbox.root / "envs" / "by-rattler"
    _install_as_rattler_does(lock, channel, prefix, sandbox.cache / "rattler" / "pkgs")
    assert (prefix / interpreter).read_bytes() == _planted(marker)  # rattler kept evil's copy in place
    res = sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), expect=1)
    assert f"modified: {interpreter} (python)" in res.output, res.output
    assert not marker.exists()
