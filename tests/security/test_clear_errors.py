"""Inputs that used to hang, crash or say "failed unexpectedly" end in one clear line (what,
why, fix), exit 1 or 2, and `--json` gives the error as JSON on stdout, argument errors included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from extforge.channel.index import reindex

from .crafted import Member, craft_package, gxx_so, member

SITE = "lib/python3.11/site-packages"
EXT_NAME = "ext.cpython-311-x86_64-linux-gnu.so"


def _json_error(res) -> dict:
    doc = json.loads(res.stdout)
    assert set(doc) == {"error", "why", "fix"}, doc
    return doc


def test_argument_errors_are_json_on_stdout(sandbox):
    res = sandbox.run("verify", "--threads", "-1", str(sandbox.root), "--json", expect=2)
    assert "-1 is not a positive whole number" in _json_error(res)["error"]
    res = sandbox.run("verify", "--json", expect=2)  # PREFIX missing
    assert "required: PREFIX" in _json_error(res)["error"]
    assert "usage: extforge verify" in res.stderr  # and argparse's usage for people, on stderr


def test_a_deeply_nested_manifest_is_one_line(sandbox):
    manifest = sandbox.path("deep") / "pixi.toml"
    manifest.write_text('[workspace]\nname = "d"\nchannels = ["x"]\nplatforms = ["linux-64"]\n'
                        "[tool.x]\na = " + "[" * 100_000 + "]" * 100_000 + "\n")
    res = sandbox.run("lock", "--manifest", str(manifest), "--json", expect=2)
    assert "nests arrays or tables too deeply" in _json_error(res)["error"]
    assert "unexpectedly" not in res.output


def test_audit_of_a_fifo_or_a_device_does_not_hang(sandbox):
    for name in ("log.fifo", "pkg-1.0-0.conda"):
        fifo = sandbox.path("fifo") / name
        os.mkfifo(fifo)
        res = sandbox.run("audit", str(fifo), "--json", expect=2, timeout=30)
        assert _json_error(res)["error"] == f"cannot audit {fifo}: it is not a regular file"
    sandbox.run("audit", "/dev/zero", expect=2, timeout=30).refused("it is not a regular file")


def test_a_10000_character_member_name_is_refused_by_publish_and_audit(sandbox):
    pkg = craft_package(sandbox.path("in"), "longname", [member("share/" + "x" * 10_000)])
    channel = sandbox.path("ch")
    with sandbox.unchanged_outside(channel):
        res = sandbox.run("publish", str(pkg), "--channel", str(channel), "--no-audit", "--json", expect=(1, 2))
    assert "longer than the 1024 allowed" in res.output
    assert not list(channel.glob("*/longname*"))
    res = sandbox.run("audit", str(pkg), "--json", expect=(1, 2))
    assert "longer than the 1024 allowed" in _json_error(res)["error"]
    # And one copied into a channel by hand is refused by install, not crashed on.
    (channel / "noarch").mkdir(exist_ok=True)
    pkg.rename(channel / "noarch" / pkg.name)
    reindex(channel)
    lock = sandbox.lock(channel, "longname")
    res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "e"), "--lock", str(lock), expect=(1, 2))
    res.refused("longer than the 1024 allowed")


def _module(sandbox, init: str) -> Path:
    so = gxx_so(sandbox.path("build"), f"{init}.so", f'extern "C" __attribute__((visibility("default"))) void* {init}() {{ return 0; }}\n')
    members = [Member(f"{SITE}/{EXT_NAME}", so.read_bytes(), mode=0o755), Member(f"{SITE}/ext.py", b"")]
    return craft_package(sandbox.path("in", init), "ext", members, subdir="linux-64")


def test_a_module_whose_init_function_is_not_its_file_name_fails_audit(sandbox):
    res = sandbox.run("audit", str(_module(sandbox, "PyInit_other")), "--json", expect=1)
    errors = [f for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"]
    assert [f["message"] for f in errors] == [f"{SITE}/{EXT_NAME} defines PyInit_other, not PyInit_ext: `import ext` fails"]
    assert "dynamic module does not define module export function" in errors[0]["cause"]
    sandbox.run("audit", str(_module(sandbox, "PyInit_ext")), expect=0)


def test_a_recipe_yaml_error_names_its_line(sandbox):
    channel = sandbox.path("ch")
    (channel / "noarch").mkdir()
    reindex(channel)
    recipe = sandbox.path("recipe")
    (recipe / "recipe.yaml").write_text('package:\n  name: x\n  version: "1.0"\nbuild:\n  script: [\n    - echo\n')
    with sandbox.unchanged_outside(sandbox.root / "out"):
        res = sandbox.run("build", str(recipe), "-c", str(channel), "-o", str(sandbox.root / "out"), "--json", expect=2)
    doc = _json_error(res)
    assert doc["error"].startswith(f"{recipe / 'recipe.yaml'} is not valid YAML: line 6, column 5")
    assert doc["why"] == "line 6 reads: '    - echo'" and "see the log" not in res.output


def test_a_reader_that_goes_away_gets_no_traceback(sandbox):
    """`extforge plan --json | head -1`: the pipe closes before the JSON is written; the command
    ends quietly with 141, as a shell reports a process that SIGPIPE ended."""
    proc = subprocess.Popen([sys.executable, "-m", "extforge", "plan", "--cores", "32", "--memory", "256G", "--json"],
                            cwd=sandbox.root, env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has started: every write meets a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "unexpectedly" not in stderr and "Exception ignored" not in stderr, stderr
