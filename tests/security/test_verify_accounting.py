"""verify accounts for every entry of the prefix: what a co-tenant who can write the env folder
plants (byte code, deep libraries, activation scripts, programs on PATH, mode bits, symlink
swaps, forged conda-meta) is a finding naming the path, with or without --lock."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from extforge.environment.receipt import receipt_path

from .pyish import MODULE, SITE, conda_meta, pyish_package

EVIL = b"import os; os.system('touch /tmp/owned')\n"


def _verify(sandbox, prefix: Path, *args: str, expect: int) -> dict:
    with sandbox.unchanged_outside():
        res = sandbox.run("verify", str(prefix), *args, "--json", expect=expect)
    return json.loads(res.stdout)


def _findings(report: dict) -> dict[str, list[str]]:
    return {c["name"]: c["findings"] for c in report["checks"]}


def _says(res, *needles: str) -> None:
    """The output names each needle (lines may be wrapped to the terminal)."""
    text = " ".join(res.output.split())
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{res.output}"


def _plant(prefix: Path, rel: str, data: bytes = EVIL, mode: int = 0o644) -> None:
    path = prefix / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


PLANTED = {
    f"{SITE}/pyish/__pycache__/__init__.cpython-311.pyc": "byte code Python runs instead of its source",
    f"{SITE}/pyish/cudnn/lib/libcudart.so.13": "a shared library the loader may pick up",
    "etc/conda/activate.d/zz.sh": "runs at every activation",
    "bin/nvcc": "on the PATH of every job",
}


@pytest.mark.parametrize("lock_args", [True, False], ids=["lock", "install-record"])
def test_planted_files_anywhere_are_reported(sandbox, pyish_env, lock_args):
    lock, prefix = pyish_env
    args = ["--env", "default", "--lock", str(lock)] if lock_args else []
    _verify(sandbox, prefix, *args, expect=0)
    for rel in PLANTED:
        _plant(prefix, rel, mode=0o755 if rel.startswith("bin/") else 0o644)
    report = _verify(sandbox, prefix, *args, expect=1)
    # A folder the packages do not have is named, and each file below it with why it matters.
    want = {f"not from any package: {rel} ({why})" for rel, why in PLANTED.items()} | {
        f"not from any package: {SITE}/pyish/__pycache__ (a folder)",
        f"not from any package: {SITE}/pyish/cudnn (a folder)",
        "not from any package: etc (a folder)",
    }
    assert set(_findings(report)["unowned"]) == want, report
    assert _findings(report)["files"] == []
    # In folders the packages do have, each file is named with why it matters.
    for folder in (f"{SITE}/pyish/__pycache__", f"{SITE}/pyish/cudnn", "etc/conda/activate.d/zz.sh"):
        shutil.rmtree(prefix / folder) if (prefix / folder).is_dir() else (prefix / folder).unlink()
    (prefix / "bin/nvcc").unlink()
    deep = {f"{SITE}/pyish/libcudart.so.13": PLANTED[f"{SITE}/pyish/cudnn/lib/libcudart.so.13"],
            "bin/ls": "on the PATH of every job"}
    for rel in deep:
        _plant(prefix, rel)
    report = _verify(sandbox, prefix, *args, expect=1)
    assert set(_findings(report)["unowned"]) == {f"not from any package: {r} ({why})" for r, why in deep.items()} | {
        "not from any package: etc (a folder)"}, report


def test_byte_code_is_compiled_at_install_or_reported(sandbox, pyish_env):
    """This prefix has no Python: nothing is compiled, so any .pyc is foreign. (The demo-ext
    case below covers a prefix whose Python compiles its modules at install.)"""
    lock, prefix = pyish_env
    record = json.loads(receipt_path(prefix).read_text())
    assert record["written"] == {} and record["environment"] == "default"
    cache = prefix / SITE / "pyish" / "__pycache__"
    cache.mkdir()
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + b"\0" * 12 + EVIL)
    report = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), "--rehash", expect=1)
    assert _findings(report)["unowned"] == [
        f"not from any package: {SITE}/pyish/__pycache__ (a folder)",
        f"not from any package: {SITE}/pyish/__pycache__/__init__.cpython-311.pyc (byte code Python runs instead of its source)",
    ]


def test_mode_changes_are_reported(sandbox, pyish_env):
    lock, prefix = pyish_env
    os.chmod(prefix / "bin/pyish", 0o6755)
    os.chmod(prefix / "lib/libpyish.so", 0o4777)
    os.chmod(prefix / SITE, 0o777)
    report = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=1)
    assert sorted(_findings(report)["files"]) == sorted([
        "mode widened: bin/pyish is 6755, pyish gives 0755",
        "mode widened: lib/libpyish.so is 4777, pyish gives 0644",
        f"mode widened: {SITE} is a folder with mode 0777 (setuid, setgid or writable by anyone)",
    ]), report


def test_owned_file_swapped_for_a_symlink_to_an_identical_copy_is_reported(sandbox, pyish_env):
    lock, prefix = pyish_env
    _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=0)
    outside = sandbox.path("elsewhere") / "__init__.py"
    shutil.copy2(prefix / MODULE, outside)
    (prefix / MODULE).unlink()
    (prefix / MODULE).symlink_to(outside)
    for args in ([], ["--rehash"]):
        report = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), *args, expect=1)
        assert _findings(report)["files"] == [f"replaced: {MODULE} is a symbolic link to {outside}, pyish has a file there"], report
    # A folder swapped for a link to a copy of it.
    (prefix / MODULE).unlink()
    shutil.copy2(outside, prefix / MODULE)
    copy = sandbox.root / "elsewhere" / "pyish"
    shutil.copytree(prefix / SITE / "pyish", copy)
    shutil.rmtree(prefix / SITE / "pyish")
    (prefix / SITE / "pyish").symlink_to(copy)
    report = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=1)
    assert _findings(report)["files"] == [f"replaced: {SITE}/pyish is a symbolic link to {copy}, the folders of the packages has a folder there"], report


def test_second_run_reads_no_folder_and_still_sees_a_new_file(sandbox, pyish_env):
    lock, prefix = pyish_env
    time.sleep(0.3)  # past the window in which an entry's ctime may share the record's tick
    first = _verify(sandbox, prefix, expect=0)
    assert first["snapshot"] == "written"
    quick = _verify(sandbox, prefix, expect=0)
    assert quick["files_hashed"] == 0 and quick["snapshot"] == "none"
    assert "(0 folder(s) read)" in next(c["summary"] for c in quick["checks"] if c["name"] == "unowned")
    _plant(prefix, f"{SITE}/pyish/libcudart.so.13")
    caught = _verify(sandbox, prefix, expect=1)
    assert _findings(caught)["unowned"] == [f"not from any package: {SITE}/pyish/libcudart.so.13 (a shared library the loader may pick up)"]
    (prefix / SITE / "pyish/libcudart.so.13").unlink()
    os.chmod(prefix / "bin/pyish", 0o4755)  # a chmod changes only the file's own ctime
    caught = _verify(sandbox, prefix, expect=1)
    assert _findings(caught)["files"] == ["mode widened: bin/pyish is 4755, pyish gives 0755"]


def _forge_package_record(prefix: Path) -> None:
    """conda-meta rewritten to name another build of pyish (its sha256 and url), as a co-tenant would."""
    record = conda_meta(prefix, "pyish")
    meta = json.loads(record.read_text())
    meta.update(sha256="ab" * 32, url="https://evil.example/noarch/pyish-1.0-0.conda", build="1")
    record.write_text(json.dumps(meta))


def test_without_lock_a_forged_conda_meta_is_caught_by_the_install_record(sandbox, pyish_env):
    lock, prefix = pyish_env
    _forge_package_record(prefix)
    for args in ([], ["--rehash"]):
        report = _verify(sandbox, prefix, *args, expect=1)
        (finding,) = _findings(report)["packages"]
        assert finding.startswith("differs: pyish installed 1.0 1 sha256 abababababab…"), report
        assert report["install_record"] == "trusted"


def test_without_a_trusted_install_record_verify_cannot_vouch(sandbox, pyish_env):
    lock, prefix = pyish_env
    record = receipt_path(prefix)
    # Writable by a group that can write the prefix too: not evidence.
    os.chmod(record, 0o664)
    res = sandbox.run("verify", str(prefix), expect=1)
    _says(res, f"cannot vouch for {prefix}: {record} is writable by others", f"extforge verify {prefix} --env NAME --lock")
    os.chmod(record, 0o644)
    os.chmod(prefix.parent, 0o777)
    res = sandbox.run("verify", str(prefix), expect=1)
    _says(res, f"the folder {prefix.parent} above it is writable by others")
    os.chmod(prefix.parent, 0o755)
    record.unlink()
    res = sandbox.run("verify", str(prefix), expect=1)
    _says(res, f"cannot vouch for {prefix}: there is no install record at {record}")
    # With the lock it is verified as before.
    _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=0)


def test_install_over_a_tampered_prefix_refuses_and_names_verify(sandbox, pyish_env):
    lock, prefix = pyish_env
    _plant(prefix, "bin/nvcc")
    with sandbox.unchanged_outside():
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=1)
    _says(res, "but its files differ: not from any package: bin/nvcc", f"extforge verify {prefix} --env default --lock")
    (prefix / "bin/nvcc").unlink()
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)


@pytest.mark.parametrize("field", ["md5", "size"])
def test_lock_whose_md5_or_size_is_wrong_is_refused(sandbox, field):
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    text = lock.read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  {field}: ")]
    wrong = "0" * 32 if field == "md5" else str(int(line.split()[-1]) + 1)
    # A lock written elsewhere (no pixi.toml beside it to be stale against), with the site's mirror config.
    other = sandbox.path("other")
    shutil.copytree(lock.parent / ".pixi", other / ".pixi")
    lock = other / "pixi.lock"
    lock.write_text(text.replace(line, f"  {field}: {wrong}"))
    prefix = sandbox.root / "envs" / "p"
    with sandbox.unchanged_outside():
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=1)
    _says(res, "pyish-1.0-0.conda (sha256 as locked, but", "the lock is inconsistent")
    assert not prefix.exists()


SYSTEM_PYTHON = Path("/usr/bin/python3.11")


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="needs root (to act as nobody) and /usr/bin/python3.11")
def test_admin_installs_job_user_verifies_without_lock_and_unreadable_entries_are_findings():
    """The Slurm case: root installs, `nobody` verifies without --lock (the install record beside
    the prefix is root's, in folders only root writes); what nobody cannot read is a finding."""
    import pwd
    import subprocess
    import sys
    import tempfile

    from .conftest import Sandbox, assert_no_crash

    base = Path(tempfile.mkdtemp(prefix="verify-as-nobody-"))
    try:
        base.chmod(0o755)
        sandbox = Sandbox(base)
        channel = sandbox.path("ch")
        pyish_package(channel)
        lock = sandbox.lock(channel, "pyish")
        prefix = sandbox.root / "envs" / "p"
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
        for d in (sandbox.root, sandbox.cache):
            d.chmod(0o755)
        user = pwd.getpwnam("nobody")
        home = base / "nobody"
        home.mkdir()
        os.chown(home, user.pw_uid, user.pw_gid)
        src = Path(__file__).resolve().parents[2] / "src"
        site = next(p for p in sys.path if p.endswith("site-packages"))

        def verify_as_nobody(*args: str):
            env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "EXTFORGE_CACHE": str(home / "cache"), "TMPDIR": str(home),
                   "RATTLER_CACHE_DIR": str(home / "rattler"), "PYTHONPATH": f"{src}:{site}", "NO_COLOR": "1", "COLUMNS": "200"}
            proc = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                                   str(SYSTEM_PYTHON), "-m", "extforge", "verify", str(prefix), *args, "--json"],
                                  env=env, capture_output=True, text=True, timeout=300, cwd=home)
            from .conftest import Result

            res = Result(("verify", str(prefix), *args), proc.returncode, proc.stdout, proc.stderr)
            assert_no_crash(res)
            return res

        channel_map = ["--channel-map", f"internal={channel.as_uri()}"]
        res = verify_as_nobody(*channel_map)
        assert res.returncode == 0, res.output
        assert json.loads(res.stdout)["install_record"] == "trusted"
        # A folder and a file of the prefix nobody may read: findings, exit 1, no traceback.
        (prefix / SITE / "pyish").chmod(0o700)
        (prefix / "bin/pyish").chmod(0o700)
        res = verify_as_nobody(*channel_map)
        assert res.returncode == 1, res.output
        found = _findings(json.loads(res.stdout))
        assert f"unreadable: {SITE}/pyish/ (Permission denied)" in found["files"], found
        assert "unreadable: bin/pyish (pyish): Permission denied" in found["files"], found
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_install_from_a_cache_whose_modes_were_widened_repairs_them(sandbox, pyish_env):
    """A chmod in a prefix is a chmod of the package cache's copy (hard links): the next install
    from that cache gets the package's modes back, and says so."""
    lock, first = pyish_env
    os.chmod(first / MODULE, 0o4755)
    prefix = sandbox.root / "envs" / "second"
    with sandbox.unchanged_outside(prefix):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    _says(res, f"repaired {MODULE}")
    assert (prefix / MODULE).stat().st_mode & 0o7777 == 0o644
    _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), "--rehash", expect=0)


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="needs root (to act as nobody) and /usr/bin/python3.11")
def test_install_record_goes_into_the_prefix_when_its_folder_is_not_writable():
    """A prefix pre-created by root for an installer (here nobody) in a folder only root writes:
    the record goes into the prefix itself, believed while only its owner writes the prefix folder."""
    import pwd
    import subprocess
    import sys
    import tempfile

    from extforge.environment.receipt import INSIDE, Receipt, find_receipt

    user = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="record-in-prefix-"))  # root's, 0755 below: nobody reaches it, cannot write it
    base.chmod(0o755)
    prefix = base / "p"
    prefix.mkdir()
    os.chown(prefix, user.pw_uid, user.pw_gid)
    record = Receipt(str(prefix), "pixi.lock", "default", []).to_json()
    src = Path(__file__).resolve().parents[2] / "src"
    site = next(p for p in sys.path if p.endswith("site-packages"))
    script = ("import json, sys; from extforge.environment.receipt import Receipt, write_receipt; "
              "print(write_receipt(Receipt.from_json(json.loads(sys.stdin.read()))))")
    try:
        proc = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                               str(SYSTEM_PYTHON), "-c", script], input=json.dumps(record), capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{src}:{site}"}, timeout=60)
        trusted, why_trusted = find_receipt(prefix)
        prefix.chmod(0o775)  # a group that may write the prefix could have written the record
        refused, why = find_receipt(prefix)
    finally:
        shutil.rmtree(base)
    assert proc.returncode == 0 and proc.stdout.strip() == str(prefix / INSIDE), proc.stderr
    assert trusted is not None and trusted.prefix == str(prefix), why_trusted
    assert refused is None and why == f"the folder {prefix} above it is writable by others (mode drwxrwxr-x)"
