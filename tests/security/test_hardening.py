"""No traceback, no litter: bad options, damaged inputs, killed runs and crashes each end in a
clear message and a defined exit code, and leave nothing behind in TMPDIR or outside the
folders a command owns. Every case runs the real `extforge` (see conftest.Sandbox.run)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extforge.publishing.publish import publish

from .crafted import craft_package, craft_wheel, gxx_so, member


@pytest.mark.parametrize("args, message", [
    (["plan", "--cores", "-3"], "-3 is not a positive whole number"),
    (["plan", "--cores", "0"], "0 is not a positive whole number"),
    (["plan", "--memory", "0"], "0 is not a positive size"),
    (["plan", "--memory", "12Q"], "cannot read memory size '12Q'"),
    (["plan", "--memory", "1P"], "cannot read memory size '1P'"),
    (["plan", "--memory", "nan"], "cannot read memory size 'nan'"),
    (["plan", "--memory", "inf"], "cannot read memory size 'inf'"),
    (["plan", "--archs", "sm_9x"], "not a CUDA arch: 'sm_9x'"),
    (["plan", "--archs", ","], "no GPU arch given"),
    (["audit", "--glibc", "abc", "x.so"], "not a glibc version: 'abc'"),
    (["audit", "--archs", "sm_9x", "x.so"], "not a CUDA arch: 'sm_9x'"),
    (["audit", "--against", "missing-env", "x.so"], "--against missing-env does not exist"),
    (["audit", "--channel", "file:///nowhere", "x.so"], "--channel does not apply to x.so"),
    (["explain"], "nothing to explain"),
    (["explain", "-"], "nothing to explain"),
])
def test_bad_options_exit_2_with_the_reason(sandbox, args, message):
    gxx_so(sandbox.root, "x.so")
    with sandbox.unchanged_outside():
        res = sandbox.run(*args, input="")
    res.refused(message, code=2)


@pytest.fixture
def locked_env(sandbox):
    """A channel with one harmless package, its pixi.lock and an installed prefix."""
    channel = sandbox.root / "ch"
    publish([craft_package(sandbox.path("in"), "okpkg")], channel, audit=False)
    lock = sandbox.lock(channel, "okpkg")
    prefix = sandbox.path("envs") / "p"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    return lock, prefix


def test_truncated_lock_file(sandbox, locked_env):
    lock, prefix = locked_env
    truncated = lock.with_name("truncated.lock")
    truncated.write_bytes(lock.read_bytes()[: len(lock.read_bytes()) // 2])
    with sandbox.unchanged_outside():
        sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(truncated)).refused("cannot read", "truncated.lock", code=2)
        sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / "q"), "--lock", str(truncated)).refused("truncated.lock", code=(1, 2))


def test_corrupt_conda_meta_record(sandbox, locked_env):
    lock, prefix = locked_env
    (record,) = (prefix / "conda-meta").glob("okpkg-*.json")
    record.write_text('{"name": ')
    with sandbox.unchanged_outside():
        sandbox.run("verify", str(prefix)).refused("is not a readable package record", record.name, code=1)
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock)).refused(record.name, code=1)


def test_prefix_that_is_a_file(sandbox, locked_env):
    lock, _ = locked_env
    afile = sandbox.root / "afile"
    afile.write_text("not a prefix\n")
    with sandbox.unchanged_outside():
        sandbox.run("install", "default", "--prefix", str(afile), "--lock", str(lock)).refused("is a file, not a folder", code=2)
        sandbox.run("verify", str(afile)).refused("is a file, not an environment's folder", code=2)


def test_yaml_error_in_variants(sandbox):
    channel = sandbox.root / "ch"
    publish([craft_package(sandbox.path("in"), "okpkg")], channel, audit=False)
    bad = sandbox.root / "variants.yaml"
    bad.write_text('python:\n  - "3.12\n  x: [\n')
    recipe = Path(__file__).resolve().parents[2] / "recipe" / "demo-ext"
    with sandbox.unchanged_outside(sandbox.root / "out"):
        res = sandbox.run("build", str(recipe), "-c", str(channel), "-m", str(bad), "-o", str(sandbox.root / "out"))
    res.refused("cannot read the variant config", "variants.yaml", code=2)


@pytest.mark.parametrize("filename, files, message", [
    ("foo-1.0-cp311.whl", None, "is not a valid wheel file name"),
    ("foo-1.0-cp311-cp311-linux_x86_64.whl", {"foo-0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311\n"},
     "malformed wheel tag 'cp311-cp311'"),
])
def test_malformed_wheel(sandbox, filename, files, message):
    wheel = craft_wheel(sandbox.path("in"), filename, files)
    with sandbox.unchanged_outside():
        sandbox.run("audit", str(wheel)).refused(message, code=2)


@pytest.mark.parametrize("member", ["../../escaped.so", "/ABS/escaped.so"])
def test_audit_refuses_a_wheel_member_leaving_its_folder(sandbox, member):
    member = member.replace("/ABS", str(sandbox.base / "abs-target"))
    wheel = craft_wheel(sandbox.path("in"), "evil-1.0-cp311-cp311-linux_x86_64.whl", {member: b"\x7fELF not really"})
    with sandbox.unchanged_outside():
        sandbox.run("audit", str(wheel)).refused("unsafe", member, code=1)


@pytest.mark.parametrize("member", ["torch-2.14.1.data/data/../../escaped.txt", "../escaped.txt", "torch/../../escaped.txt"])
def test_mirror_refuses_a_wheel_member_leaving_the_prefix(sandbox, member):
    wheels = sandbox.path("wheels")
    craft_wheel(wheels, "torch-2.14.1-cp311-cp311-linux_x86_64.whl", {
        "torch/version.py": b'__version__ = "2.14.1"\ncuda = None\n',
        "torch-2.14.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n",
        "torch-2.14.1.dist-info/WHEEL": f"Wheel-Version: 1.0\nTag: cp{sys.version_info[0]}{sys.version_info[1]}-"
                                        f"cp{sys.version_info[0]}{sys.version_info[1]}-linux_x86_64\n".encode(),
        member: b"escaped\n",
    })
    wheels.joinpath("torch-2.14.1-cp311-cp311-linux_x86_64.whl").rename(
        wheels / f"torch-2.14.1-cp{sys.version_info[0]}{sys.version_info[1]}-cp{sys.version_info[0]}{sys.version_info[1]}-linux_x86_64.whl")
    channel = sandbox.root / "mirror"
    with sandbox.unchanged_outside(channel):
        res = sandbox.run("mirror", "--channel", str(channel), "--from-wheels", str(wheels))
    res.refused("unsafe", member, code=1)


@pytest.mark.parametrize("why", ["missing folder", "no matching package"])
def test_failed_lock_never_dies_by_a_signal(sandbox, why):
    """py-rattler's tokio threads used to crash the interpreter's finalization after a failed
    solve (SIGABRT/SIGSEGV in 6 of 20 runs); 20 runs in a row must all exit 2."""
    channel = sandbox.root / "ch"
    publish([craft_package(sandbox.path("in"), "okpkg")], channel, audit=False)
    manifest = sandbox.manifest("okpkg" if why == "missing folder" else "nosuchpkg")
    url = (sandbox.root / "missing").as_uri() if why == "missing folder" else channel.as_uri()
    codes = []
    with sandbox.unchanged_outside():
        for _ in range(20):
            res = sandbox.run("lock", "--manifest", str(manifest), "--channel-map", f"internal={url}")
            codes.append(res.returncode)
    assert codes == [2] * 20, codes
    assert "not a channel folder" in res.output if why == "missing folder" else "nosuchpkg" in res.output


def _slow_package(sandbox) -> Path:
    """Many incompressible .so members: extracting them keeps an audit busy for a while."""
    pads = [member(f"lib/libpad{i}.so", b"\x7fELF" + os.urandom(64 * 1024)) for i in range(300)]
    return craft_package(sandbox.path("in"), "slow", pads, fmt="tar.bz2")


def _audit_caught_mid_run(sandbox) -> subprocess.Popen:
    """An `extforge audit` process seen while its scratch folder exists (retried: on a loaded
    machine a run may finish between two looks)."""
    pkg = _slow_package(sandbox)
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "extforge", "audit", str(pkg)], env=sandbox.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(sandbox.tmp.glob("extforge-audit-*")) and proc.poll() is None:
            time.sleep(0.005)
        if proc.poll() is None:
            return proc
        proc.communicate()
    pytest.fail("every audit ended before it could be stopped")


def test_killed_audit_leaves_scratch_that_the_next_run_removes(sandbox):
    """A SIGKILL skips all cleanup; the next audit removes the dead run's scratch folder."""
    proc = _audit_caught_mid_run(sandbox)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    left = list(sandbox.tmp.glob("extforge-audit-*"))
    assert left and all(f"-{socket.gethostname()}-{proc.pid}-" in p.name for p in left), left
    sandbox.run("audit", str(craft_package(sandbox.path("in"), "small")))  # TMPDIR must be empty after it


def test_sigterm_removes_scratch(sandbox):
    proc = _audit_caught_mid_run(sandbox)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err and proc.returncode == 130, out + err
    assert not list(sandbox.tmp.iterdir())


CRASHING = """
import sys
import extforge.commands.plan as plan
def boom(args):
    raise RuntimeError("something nobody planned for")
plan.run = boom
from extforge.cli import main
sys.argv = ["extforge", "plan"]
sys.exit(main())
"""


def test_unexpected_exception_is_one_line_and_a_log(sandbox):
    proc = subprocess.run([sys.executable, "-c", CRASHING], env=sandbox.env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if ln.strip()]
    assert "extforge plan failed unexpectedly: RuntimeError: something nobody planned for; details in" in line
    log = Path(line.rsplit("details in ", 1)[1].strip())
    assert log.is_relative_to(sandbox.cache) and "Traceback" in log.read_text() and "boom" in log.read_text()


RECIPE = """\
package:
  name: cwd-victim
  version: "1.0"
build:
  noarch: generic
  number: 0
  script:
    # The user's working directory is replaced while the build runs (as when a long build
    # outlives a checkout that is re-cloned): the steps after the build must not need it.
    - rm -rf {cwd}
    - mkdir {cwd}
    - mkdir -p $PREFIX/share/cwd-victim
    - echo ok > $PREFIX/share/cwd-victim/ok.txt
"""


def test_build_survives_its_working_directory_being_replaced(sandbox):
    cwd = sandbox.path("checkout")
    recipe = sandbox.path("recipe") / "recipe.yaml"
    recipe.write_text(RECIPE.format(cwd=cwd))
    channel = sandbox.path("empty-channel")
    for sd in ("noarch", "linux-64"):
        (channel / sd).mkdir()
        (channel / sd / "repodata.json").write_text(json.dumps({"info": {"subdir": sd}, "packages": {}, "packages.conda": {}}))
    out = sandbox.root / "out"
    # A placeholder package with no compiled code: this is about the build's cwd, not its audit.
    res = sandbox.run("build", str(recipe), "-c", str(channel), "-o", str(out), "--no-test", "--no-audit", cwd=cwd,
                      timeout=600)
    assert res.returncode in (0, 1), res.output  # the audit may fail a package without ELF files
    assert list((out / "noarch").glob("cwd-victim-1.0-*.conda")), res.output
    assert "getcwd" not in res.output and "FileNotFoundError" not in res.output


def test_publish_repairs_a_log_that_lacks_a_channel_file(sandbox):
    """A publisher killed between copying a package in and logging it leaves a file the log
    lacks (and a torn last line); the next publish logs it before any re-index serves it."""
    channel = sandbox.root / "ch"
    publish([craft_package(sandbox.path("in"), "first")], channel, audit=False)
    orphan = craft_package(channel / "noarch", "orphan")
    with (channel / "publish-log.jsonl").open("a") as log:
        log.write('{"file": "noarch/torn')  # killed inside its write
    second = craft_package(sandbox.path("in"), "second")
    with sandbox.unchanged_outside(channel):
        res = sandbox.run("publish", str(second), "--channel", str(channel), "--no-audit", expect=0)
    assert "publish log repaired: 1 package file(s)" in res.output and f"noarch/{orphan.name}" in res.output
    entries = [json.loads(line) for line in (channel / "publish-log.jsonl").read_text().splitlines() if line.endswith("}")]
    by_file = {e["file"]: e["status"] for e in entries if "status" in e}
    assert by_file == {"noarch/first-1.0-0.conda": "published", f"noarch/{orphan.name}": "recovered",
                       "noarch/second-1.0-0.conda": "published"}, by_file
