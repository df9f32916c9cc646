"""`extforge mirror --python`: a CPython other than extforge's own, and one channel that gathers
several torch builds as rows (a stand-in torch wheel keeps this to the python packages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extforge.mirror.rows import ROWS_FILE
from pythons import python_or_skip
from stand_in import stand_in_torch


def mirror(channel: Path, wheels: Path, python: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "extforge", "mirror", "--channel", str(channel), "--json",
                           "--from-wheels", str(wheels), "--python", python], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_two_pythons_two_torch_builds_one_channel(tmp_path: Path):
    py312, py313 = python_or_skip("3.12"), python_or_skip("3.13")
    channel = tmp_path / "channel"
    stand_in_torch(tmp_path / "old", "2.6.0", abi=0)
    stand_in_torch(tmp_path / "new", "2.9.1", abi=1)
    first = mirror(channel, tmp_path / "old", py312)
    by_name = {p["name"]: p for p in first["packages"]}
    assert by_name["python"]["version"].startswith("3.12.")
    assert by_name["pytorch"]["build"].startswith("cpu_py312_")
    assert first["variants"]["cxx_abi"] == "cxx98"

    second = mirror(channel, tmp_path / "new", py313)
    assert second["variants"]["python"] == "3.13" and second["variants"]["cxx_abi"] == "cxx11"
    # Both rows' packages are in the channel, and its variants.yaml lists both rows, zipped.
    files = {p.name for p in (channel / "linux-64").glob("*.conda")}
    assert {Path(p["file"]).name for p in first["packages"] + second["packages"]} <= files
    variants = (channel / "variants.yaml").read_text()
    assert 'python: ["3.12", "3.13"]' in variants and 'cxx_abi: ["cxx98", "cxx11"]' in variants
    assert "zip_keys:" in variants
    assert len(json.loads((channel / ROWS_FILE).read_text())["rows"]) == 2

    # Mirroring a row again builds nothing and keeps the other row.
    again = mirror(channel, tmp_path / "old", py312)
    assert again["built"] == 0
    assert {Path(p["file"]).name for p in second["packages"]} <= {p.name for p in (channel / "linux-64").glob("*.conda")}


def test_a_missing_python_is_one_paragraph(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "extforge", "mirror", "--channel", str(tmp_path / "c"),
                           "--from-wheels", str(tmp_path), "--python", str(tmp_path / "no-python")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    text = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "does not exist" in text and "--python" in text and "Traceback" not in text


@pytest.mark.parametrize("planted, said", [
    # The row this run mirrors (its key: python, torch, no CUDA, the old ABI), so that the run
    # replaces it and removes the files it names.
    ({"schema": 1, "rows": [{"variants": {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "pytorch": "2.6.0",
                                          "cxx_abi": "cxx98"}, "files": ["linux-64/../../victim.txt"]}]},
     "not a package file <subdir>/<name>.conda of the channel"),
    ({"rows": [{"variants": 1, "files": []}]}, "a row is not"),
    ("[" * 100_000, "nested more than"),
], ids=["outside", "malformed", "deep"])
def test_a_rows_file_extforge_did_not_write_is_refused_before_any_work(tmp_path: Path, planted: object, said: str):
    """outside: a rows file naming `linux-64/../../victim.txt` had the mirror delete that file (a
    re-mirrored row's old files are removed: `channel / name`, unlinked); malformed: a KeyError or
    TypeError traceback; deep: a RecursionError. Now each is one error naming the file and what
    to do, before any package is built, and the file named stays."""
    channel = tmp_path / "channel"
    channel.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (channel / ROWS_FILE).write_text(planted if isinstance(planted, str) else json.dumps(planted))
    stand_in_torch(tmp_path / "wheels", "2.6.0", abi=0)
    proc = subprocess.run([sys.executable, "-m", "extforge", "mirror", "--channel", str(channel), "--from-wheels",
                           str(tmp_path / "wheels"), "--python", sys.executable], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert f"cannot add a row to the mirror channel {channel}" in text and said in text, proc.stderr
    assert "Traceback" not in proc.stderr and victim.read_text() == "mine"
    assert not list(channel.glob("*/*.conda"))
