"""Install's byte-compile step: a .pyc Python would take as it is stays, every other module is
compiled by the python package's interpreter, on every core."""

import importlib.util
import os
import py_compile
import sys
from pathlib import Path

from extforge.environment.receipt import compile_bytecode

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _pyc(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def test_shipped_byte_code_stays_and_the_rest_is_compiled(tmp_path: Path):
    staging, prefix = tmp_path / "staging", tmp_path / "final"
    (staging / "bin").mkdir(parents=True)
    (staging / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    site = staging / SITE
    site.mkdir(parents=True)
    owned = set()
    # Enough modules that the step spreads them over processes.
    for i in range(150):
        (site / f"m{i}.py").write_text(f"VALUE = {i}\n")
        owned.add(f"{SITE}/m{i}.py")
    shipped = site / "m0.py"  # a package's checked-hash .pyc, linked from the package cache: kept
    cached = tmp_path / "pkgs" / "m0.cpython.pyc"
    cached.parent.mkdir()
    py_compile.compile(str(shipped), cfile=str(cached), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    _pyc(shipped).parent.mkdir()
    os.link(cached, _pyc(shipped))
    owned.add(_pyc(shipped).relative_to(staging).as_posix())
    shipped_ino = _pyc(shipped).stat().st_ino
    stale = site / "m1.py"  # a hash .pyc of other source text: compiled again
    py_compile.compile(str(stale), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    stale.write_text("VALUE = 'changed'\n")
    dated = site / "m2.py"  # a timestamped .pyc whose source has another mtime: compiled again
    py_compile.compile(str(dated))
    os.utime(dated, (1, 1))
    dated_ino = _pyc(dated).stat().st_ino
    (site / "broken.py").write_text("print 'py2 test data'\n")
    owned.add(f"{SITE}/broken.py")

    done = compile_bytecode(staging, prefix, sorted(p for p in owned if p.endswith(".py")), staging / "bin" / "python")
    written = done.written

    assert _pyc(shipped).stat().st_ino == shipped_ino
    assert _pyc(dated).stat().st_ino != dated_ino
    assert importlib.util.source_hash(stale.read_bytes()) != _pyc(stale).read_bytes()[8:16]
    assert int.from_bytes(_pyc(stale).read_bytes()[4:8], "little") == 0  # compiled at install: timestamped
    # The record vouches for what install compiled; the package for its own .pyc, which verify
    # then finds linked from the package cache, as every file of a package is.
    assert f"{Path(SITE, '__pycache__', _pyc(shipped).name)}" not in written
    for i in range(1, 150):
        assert f"{Path(SITE, '__pycache__', _pyc(site / f'm{i}.py').name)}" in written
    assert not _pyc(site / "broken.py").exists()
    # What the interpreter reported: its cache tag and the one source it took the .pyc of as it is.
    assert done.tag == sys.implementation.cache_tag
    assert done.current == {f"{SITE}/m0.py"}
    # Code objects name the final prefix, not the staging folder.
    assert str(prefix / SITE / "m5.py").encode() in _pyc(site / "m5.py").read_bytes()
