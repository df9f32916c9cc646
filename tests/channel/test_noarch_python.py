"""noarch: python packages (most of conda-forge's pure-python packages: einops, jinja2, sympy…)
install and verify: their files placed under the env's lib/pythonX.Y/site-packages, python-scripts/
in bin/, and the entry points rattler writes checked against the script it writes (a real
rattler-build package, the mirror's real python)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rattler_build import Stage0Recipe

from cli_run import EXTFORGE
from extforge.environment.trust import PackageRef, python_minor
from extforge.publishing.publish import publish

RECIPE = """\
schema_version: 1
package:
  name: tinypy
  version: "1.0"
build:
  number: 0
  noarch: python
  script:
    - mkdir -p $SP_DIR/tinypy
    - printf 'class cli:\\n    @staticmethod\\n    def run():\\n        print("tinypy ran")\\n' > $SP_DIR/tinypy/__init__.py
    - printf '#!/usr/bin/env python\\nprint("a python script")\\n' > $PREFIX/bin/tinypy-script
    - chmod 755 $PREFIX/bin/tinypy-script
  python:
    entry_points:
      - tinypy-hello = tinypy:cli.run
requirements:
  host:
    - python
  run:
    - python
"""


@pytest.fixture(scope="module")
def noarch_channel(mirror_channel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("noarch")
    (work / "recipe").mkdir()
    (work / "recipe" / "recipe.yaml").write_text(RECIPE)
    Stage0Recipe.from_file(work / "recipe" / "recipe.yaml").run_build(output_dir=work / "out", channels=[mirror_channel.as_uri()])
    (pkg,) = (work / "out" / "noarch").glob("tinypy-*.conda")
    publish([pkg], work / "internal", audit=False)
    return work / "internal"


def _workspace(tmp_path: Path, internal: Path, mirror: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pixi.toml").write_text(f'[workspace]\nname = "t"\nchannels = ["{internal.as_uri()}", "{mirror.as_uri()}"]\n'
                                  'platforms = ["linux-64"]\n\n[dependencies]\npython = "3.11.*"\ntinypy = "*"\n')
    lock = subprocess.run([*EXTFORGE, "lock", "--manifest", str(ws / "pixi.toml")], capture_output=True, text=True)
    assert lock.returncode == 0, lock.stderr
    return ws / "pixi.lock"


@pytest.mark.parametrize("where", ["env", "team envs/env"])
def test_a_noarch_python_package_installs_runs_and_verifies(noarch_channel, mirror_channel, tmp_path, where):
    lock = _workspace(tmp_path, noarch_channel, mirror_channel)
    prefix = tmp_path / where
    proc = subprocess.run([*EXTFORGE, "install", "default", "--prefix", str(prefix), "--lock", str(lock)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (prefix / "lib/python3.11/site-packages/tinypy/__init__.py").is_file() and not (prefix / "site-packages").exists()
    # The entry point rattler wrote (with a space in the path: its /bin/sh trampoline) runs the function.
    assert subprocess.run([prefix / "bin" / "tinypy-hello"], capture_output=True, text=True).stdout == "tinypy ran\n"
    assert subprocess.run([prefix / "bin" / "python", prefix / "bin" / "tinypy-script"], capture_output=True,
                          text=True).stdout == "a python script\n"

    def verify() -> dict:
        run = subprocess.run([*EXTFORGE, "verify", str(prefix), "--env", "default", "--lock", str(lock), "--json", "--rehash"],
                             capture_output=True, text=True)
        return {c["name"]: c for c in json.loads(run.stdout)["checks"]}

    checks = verify()
    assert checks["files"]["verdict"] == "pass" and checks["unowned"]["verdict"] == "pass", checks
    # The entry point is checked by its bytes like any file of the package.
    script = prefix / "bin" / "tinypy-hello"
    script.write_text(script.read_text().replace("cli.run()", "cli.run() or __import__('os').system('id')"))
    checks = verify()
    assert checks["files"]["verdict"] == "fail"
    assert any(f.startswith("modified: bin/tinypy-hello (tinypy)") for f in checks["files"]["findings"]), checks


def test_python_minor_comes_from_the_python_package():
    refs = [PackageRef("tinypy", "tinypy-1.0-pyh0_0.conda", "", ""), PackageRef("python", "python-3.12.1-hb0f4dca_0_cpython.conda", "", "")]
    assert python_minor(refs) == "3.12"
    assert python_minor(refs[:1]) is None


def test_an_entry_point_whose_name_leaves_bin_is_refused():
    """Its script would be expected at bin/<name>: verify would read outside the prefix."""
    from extforge.environment.trust import _entry_point_ok

    assert _entry_point_ok("tinypy-hello = tinypy:cli.run")
    for bad in ("../../escaped = os:getcwd", "a/b = m:f", ".. = m:f", " = m:f", "no-equals-sign", 3):
        assert not _entry_point_ok(bad), bad
