"""verify trusts only what the lock vouches for: not conda-meta, not a record a prefix writer
could forge, and it reports what no package put on Python's import path."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from .pyish import MODULE, PLACEHOLDER, SITE, forge_record

EVIL = b"import os; os.system('touch /tmp/owned')\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verify(sandbox, prefix: Path, *args: str, expect: int):
    with sandbox.unchanged_outside():
        return sandbox.run("verify", str(prefix), *args, "--json", expect=expect)


def _findings(res) -> dict[str, list[str]]:
    return {c["name"]: c["findings"] for c in json.loads(res.stdout)["checks"]}


def test_clean_install_passes_with_placeholders_rewritten(sandbox, pyish_env):
    lock, prefix = pyish_env
    assert f"#!{prefix}/bin/python3.11\n" in (prefix / "bin/pyish").read_text()
    assert str(prefix).encode() + b"/lib:" in (prefix / "lib/libpyish.so").read_bytes()
    assert PLACEHOLDER not in (prefix / "bin/pyish").read_text()
    _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), "--rehash", expect=0)


@pytest.mark.parametrize("mode", [["--env", "default", "--lock", "LOCK", "--rehash"], ["--env", "default", "--lock", "LOCK"], []],
                         ids=["lock-rehash", "lock", "no-lock"])
def test_file_edited_with_its_conda_meta_record_is_caught(sandbox, pyish_env, mode):
    lock, prefix = pyish_env
    forge_record(prefix, "pyish", MODULE, EVIL)
    res = _verify(sandbox, prefix, *[str(lock) if a == "LOCK" else a for a in mode], expect=1)
    assert any(f.startswith(f"modified: {MODULE} (pyish)") for f in _findings(res)["files"]), res.output


def test_forged_unchanged_record_is_not_believed(sandbox, pyish_env):
    lock, prefix = pyish_env
    time.sleep(3.2)  # past the window in which a file's ctime may share the record's tick
    _verify(sandbox, prefix, expect=0)
    quick = _verify(sandbox, prefix, expect=0)
    assert json.loads(quick.stdout)["files_hashed"] == 0  # the record is in use
    (record,) = (sandbox.cache / f"trust-{os.getuid()}" / "verified").glob("*.json")

    # Same size, mtime set back; then the record is rewritten to vouch for the new stat.
    path = prefix / MODULE
    before = path.stat()
    path.write_bytes(b"VALUE = 2\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    mac, _, body = record.read_bytes().partition(b"\n")
    data = json.loads(body)
    st = path.stat()
    data["entries"][MODULE] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode]
    data["taken_ns"] = time.time_ns() + 10 * 10**9
    record.write_bytes(mac + b"\n" + json.dumps(data, separators=(",", ":")).encode())
    # The old record location inside the prefix is not read at all any more.
    (prefix / "conda-meta" / "extforge").mkdir(exist_ok=True)
    (prefix / "conda-meta" / "extforge" / "verified-files.json").write_text(json.dumps({"schema": 1, "taken_ns": 0, "files": {}}))
    res = _verify(sandbox, prefix, expect=1)
    assert any(f.startswith(f"modified: {MODULE} (pyish)") for f in _findings(res)["files"]), res.output


def test_forged_manifest_in_the_trust_folder_is_rebuilt_from_the_package(sandbox, pyish_env):
    lock, prefix = pyish_env
    forge_record(prefix, "pyish", MODULE, EVIL)
    sha = json.loads(next((prefix / "conda-meta").glob("pyish-*.json")).read_text())["sha256"]
    manifest = sandbox.cache / f"trust-{os.getuid()}" / "manifests" / f"{sha}.json"
    mac, _, body = manifest.read_bytes().partition(b"\n")
    forged = body.replace(_sha(b"VALUE = 1\n").encode(), _sha(EVIL).encode())
    assert forged != body
    manifest.write_bytes(mac + b"\n" + forged)
    res = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=1)
    assert any(f.startswith(f"modified: {MODULE} (pyish)") for f in _findings(res)["files"]), res.output


def test_trust_folder_others_can_write_is_refused(sandbox, pyish_env):
    lock, prefix = pyish_env
    trust = sandbox.cache / f"trust-{os.getuid()}"
    os.chmod(trust, 0o770)
    res = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=2)
    res.refused(f"refusing to use {trust}: its mode is drwxrwx---, not drwx------", code=2)


def test_files_no_package_owns_on_the_import_path_are_reported(sandbox, pyish_env):
    lock, prefix = pyish_env
    planted = {
        f"{SITE}/zz-evil.pth": b"import os; os.system('id')\n",
        f"{SITE}/sitecustomize.py": EVIL,
        "lib/python3.11/usercustomize.py": EVIL,
        f"{SITE}/requests/__init__.py": EVIL,
        f"{SITE}/six.py": EVIL,
    }
    for rel, data in planted.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_bytes(data)
    res = _verify(sandbox, prefix, "--env", "default", "--lock", str(lock), expect=1)
    found = _findings(res)["unowned"]
    assert sorted(found) == sorted([
        f"not from any package: {SITE}/zz-evil.pth (runs code at every python start)",
        f"not from any package: {SITE}/sitecustomize.py (runs code at every python start)",
        "not from any package: lib/python3.11/usercustomize.py (runs code at every python start)",
        f"not from any package: {SITE}/requests (importable module)",
        f"not from any package: {SITE}/requests/__init__.py (importable module)",
        f"not from any package: {SITE}/six.py (importable module)",
    ]), res.output
    assert _findings(res)["files"] == []
