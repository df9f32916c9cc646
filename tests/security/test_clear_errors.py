"""Inputs that used to hang, crash or say "failed unexpectedly" end in one clear line (what,
why, fix), exit 1 or 2, and `--json` gives the error as JSON on stdout, argument errors included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from extforge.publishing.index import reindex

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


@pytest.mark.parametrize("what", ["a plan", "an error"])
def test_a_reader_that_goes_away_gets_no_traceback(sandbox, what):
    """`extforge plan --json | head -1`: the pipe closes before the JSON is written, the plan's or
    an error's (a plan with no recipe: the error's JSON met the closed pipe and gave a traceback);
    the command ends quietly with 141, as a shell reports a process that SIGPIPE ended."""
    recipe = [str(Path(__file__).resolve().parents[2] / "recipe" / "demo-ext")] if what == "a plan" else []
    proc = subprocess.Popen([sys.executable, "-m", "extforge", "plan", *recipe, "--cores", "32", "--memory", "256G", "--json"],
                            cwd=sandbox.root, env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has started: every write meets a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "unexpectedly" not in stderr and "Exception ignored" not in stderr, stderr


@contextmanager
def _small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real file system that fills up: a tmpfs of `size` mounted at `where` (root only)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill ({mounted.stderr.strip() or 'mount failed'}): needs root and mount rights")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path, leave: int) -> None:
    vfs = os.statvfs(folder)
    (folder / "filler").write_bytes(bytes(max(0, vfs.f_bavail * vfs.f_frsize - leave)))


def test_a_full_disk_names_the_file_system_and_leaves_channel_lock_and_prefix_as_they_were(sandbox):
    # publish: a 1 MiB package into a channel on a full 512 KiB file system.
    so = gxx_so(sandbox.path("so"), "libbig.so").read_bytes() + os.urandom(1 << 20)  # trailing bytes: still an ELF
    big = craft_package(sandbox.path("in"), "big", [member("lib/libbig.so", so)])
    small = craft_package(sandbox.path("in"), "small")
    with _small_tmpfs(sandbox.root / "full", "768k") as mnt:
        channel = mnt / "ch"
        sandbox.run("publish", str(small), "--channel", str(channel), "--no-audit", expect=0)
        before = {p: p.read_bytes() for p in sorted(channel.rglob("*")) if p.is_file()}
        res = sandbox.run("publish", str(big), "--channel", str(channel), "--no-audit", "--json", expect=2)
        doc = _json_error(res)
        assert doc["error"].startswith(f"no space left on the file system {mnt} ("), doc
        assert f"while writing {channel}/noarch/{big.name}" in doc["error"] and f"df -h {mnt}" in doc["fix"], doc
        assert "unexpectedly" not in res.output
        assert {p: p.read_bytes() for p in sorted(channel.rglob("*")) if p.is_file() and "lock" not in p.name} == \
            {p: b for p, b in before.items() if "lock" not in p.name}
        # lock: a workspace on a file system with no room left for the new pixi.lock.
        channel2 = sandbox.path("ch2")
        from .pyish import pyish_package

        pyish_package(channel2)
        ws = mnt / "ws"
        ws.mkdir()
        lock = sandbox.lock(channel2, "pyish")
        for f in (lock, lock.parent / ".pixi" / "config.toml", lock.parent / "pixi.toml"):
            (ws / f.relative_to(lock.parent)).parent.mkdir(parents=True, exist_ok=True)
            (ws / f.relative_to(lock.parent)).write_bytes(f.read_bytes())
        old = (ws / "pixi.lock").read_bytes()
        (ws / "pixi.toml").write_text((ws / "pixi.toml").read_text().replace('pyish = "*"', 'pyish = ">=1"'))
        (mnt / "filler").unlink(missing_ok=True)
        _fill(mnt, 0)
        res = sandbox.run("lock", "--manifest", str(ws / "pixi.toml"), expect=2)
        res.refused(f"no space left on the file system {mnt}")
        assert (ws / "pixi.lock").read_bytes() == old
        assert not [p for p in ws.rglob("*") if ".tmp" in p.name]
        # install: the prefix on the full file system is removed again, nothing half-linked stays.
        res = sandbox.run("install", "default", "--prefix", str(mnt / "env"), "--lock", str(lock), expect=2)
        res.refused(f"no space left on the file system {mnt}")
        assert not (mnt / "env").exists()
    # audit: it unpacks the package's libraries into a temporary folder too small for them.
    with _small_tmpfs(sandbox.base / "small-tmp", "64k") as scratch:
        res = sandbox.run("audit", str(big), env={"TMPDIR": str(scratch)}, expect=2)
        res.refused(f"no space left on the file system {scratch}")
        assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("value", ["file", "/dev/null", "relative/cache"])
def test_a_bad_cache_setting_is_one_line(sandbox, value):
    if value == "file":
        value = str(sandbox.root / "a-file")
        Path(value).write_text("x")
    res = sandbox.run("cache", "--json", env={"EXTFORGE_CACHE": value}, expect=2)
    assert _json_error(res)["error"].startswith(f"$EXTFORGE_CACHE={value!r} is "), res.output


def test_a_cache_on_a_kernel_interface_is_one_line(sandbox, pyish_env):
    """`EXTFORGE_CACHE=/proc/self` passed as a folder: install then failed unexpectedly
    (FileNotFoundError: '/proc/self/pkgs'), its crash log refused too."""
    lock, _ = pyish_env
    for value in ("/proc/self", "/proc/self/cache", "/sys/kernel"):
        res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / "q"), "--lock", str(lock),
                          env={"EXTFORGE_CACHE": value}, expect=2)
        res.refused(f"$EXTFORGE_CACHE={value!r} is on a file system that stores no files", "point it at a folder on a disk")
    assert not (sandbox.root / "envs" / "q").exists()


def test_verify_of_a_missing_path_or_a_file_says_so(sandbox, pyish_env):
    """verify of a path that does not exist, or of a plain file, said "P is not a conda
    environment: it has no conda-meta folder", as if the path were an environment's folder."""
    lock, prefix = pyish_env
    missing = sandbox.root / "envs" / "typo"
    sandbox.run("verify", str(missing), "--env", "default", "--lock", str(lock), expect=2).refused(
        f"{missing} does not exist", "pass the folder given to `extforge install --prefix`")
    a_file = prefix / "lib" / "libpyish.so"
    res = sandbox.run("verify", str(a_file), expect=2).refused(f"{a_file} is a file, not an environment's folder")
    assert "conda-meta" not in res.output
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), expect=0)


def test_manifest_platforms_and_pypi_dependencies_are_checked(sandbox):
    ws = sandbox.path("ws-bad")
    head = '[workspace]\nname = "t"\nchannels = ["x"]\n'
    (ws / "pixi.toml").write_text(head + 'platforms = ["linux-64", "beos-99"]\n[dependencies]\npython = "*"\n')
    res = sandbox.run("lock", "--manifest", str(ws / "pixi.toml"), "--json", expect=2)
    assert _json_error(res)["error"] == f"platform 'beos-99' in {ws / 'pixi.toml'} is not a conda subdir"
    # PyPI dependencies are locked into pylock.toml, from indexes only: a path source pins no wheel by hash.
    for table in ("pypi-dependencies", "feature.gpu.pypi-dependencies"):
        (ws / "pixi.toml").write_text(head + f'platforms = ["linux-64"]\n[dependencies]\npython = "*"\n[{table}]\n'
                                      'requests = { path = "./requests" }\n')
        res = sandbox.run("lock", "--manifest", str(ws / "pixi.toml"), "--json", expect=2)
        assert _json_error(res)["error"] == f"[{table}] requests = {{ path = ... }} is not locked by extforge"
    assert not (ws / "pixi.lock").exists()


def test_paths_too_long_loops_and_a_folder_at_the_record_are_one_line(sandbox, pyish_env):
    lock, prefix = pyish_env
    long = sandbox.root / ("a" * 300)
    sandbox.run("verify", str(long), "--env", "default", "--lock", str(lock), expect=2).refused("a path is too long")
    sandbox.run("install", "default", "--prefix", str(long / "p"), "--lock", str(lock), expect=2).refused("a path is too long")
    (sandbox.root / "loop1").symlink_to(sandbox.root / "loop2")
    (sandbox.root / "loop2").symlink_to(sandbox.root / "loop1")
    sandbox.run("verify", str(sandbox.root / "loop1"), expect=2).refused("cannot be resolved", "symbolic-link loops")
    # A folder where the install record goes beside the prefix: it goes into the prefix instead.
    other = sandbox.root / "envs" / "q"
    (other.parent / f".{other.name}.extforge-install.json").mkdir()
    sandbox.run("install", "default", "--prefix", str(other), "--lock", str(lock), expect=0)
    assert (other / ".extforge-install.json").is_file()
    sandbox.run("verify", str(other), "--env", "default", "--lock", str(lock), expect=0)


def test_a_recipe_sha256_that_is_no_digest_is_refused(sandbox):
    recipe = sandbox.path("recipe-sha")
    (recipe / "recipe.yaml").write_text(
        'package: {name: tinypkg, version: "1.0"}\nsource:\n  url: https://example.invalid/tinypkg-1.0.tar.gz\n'
        '  sha256: "../../../../tmp/x"\nbuild: {noarch: generic, script: [echo]}\n')
    res = sandbox.run("sources", "fetch", str(recipe), "--dest", str(sandbox.root / "store"), "--json", expect=2)
    doc = _json_error(res)
    assert doc["error"] == f"cannot read the sources of {recipe / 'recipe.yaml'}", res.output
    assert "Invalid SHA256 checksum: ../../../../tmp/x" in doc["why"] and not list(sandbox.root.glob("store*"))


def test_a_deeply_nested_repodata_is_rebuilt_not_a_crash_of_every_publish(sandbox):
    channel = sandbox.path("ch-deep")
    first, second = (craft_package(sandbox.path("in-deep"), n) for n in ("deep-a", "deep-b"))
    sandbox.run("publish", str(first), "--channel", str(channel), "--no-audit", expect=0)
    (channel / "noarch" / "repodata.json").write_text("[" * 200_000 + "]" * 200_000)
    res = sandbox.run("publish", str(second), "--channel", str(channel), "--no-audit", "--json", expect=0)
    assert json.loads(res.stdout)["repodata_rebuilt"] == ["noarch"]
    served = json.loads((channel / "noarch" / "repodata.json").read_text())["packages.conda"]
    assert set(served) == {first.name, second.name}
