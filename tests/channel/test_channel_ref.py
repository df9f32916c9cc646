"""A channel folder is the same folder however it is named: path, file:// URL with %20 / %23."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from extforge.channel_ref import channel_url, listing, local_folder, package_names, repodata_mentions
from extforge.publishing.index import reindex
from extforge.publishing.publish import parse_channel
from extforge.recipes.variants import CHANNEL_VARIANTS, channel_files

from .conftest import copy_packages


def test_channel_folder_with_space_and_hash(tmp_path: Path, tiny_packages) -> None:
    folder = tmp_path / "team channels #2" / "internal"
    copy_packages(tiny_packages.distinct[:2], folder / "noarch")
    (folder / "linux-64").mkdir()
    reindex(folder)
    (folder / CHANNEL_VARIANTS).write_text("python:\n  - '3.12'\n")

    url = channel_url(folder)
    assert "%20" in url and "%23" in url  # quoted as a URL must be
    assert local_folder(url) == folder.resolve() == local_folder(str(folder))
    assert local_folder("https://example.org/channel") is None

    names = {p.name for p in tiny_packages.distinct[:2]}
    assert listing(url, {"noarch"}) == {f"noarch/{n}" for n in names}
    assert package_names([url]) == {"tiny-00", "tiny-01"}
    assert repodata_mentions([url], '"tiny-01"') and not repodata_mentions([url], '"__cuda')
    assert channel_files([url]) == [folder.resolve() / CHANNEL_VARIANTS]
    assert parse_channel(url) == ("folder", str(folder.resolve()))

    # rattler itself solves from the quoted URL: the same folder, not a missing one.
    from rattler import solve

    records = asyncio.run(solve([url], ["tiny-01"], platforms=["linux-64", "noarch"]))
    assert [r.name.normalized for r in records] == ["tiny-01"]


def test_a_package_rewritten_in_place_is_indexed_again(tmp_path: Path) -> None:
    """rattler-build indexes its output folder, then the audit stamps the package (new bytes,
    same name): the next index must carry the new sha256, or a lock of that channel refuses it."""
    import hashlib

    from security.pyish import pyish_package

    channel = tmp_path / "ch"
    pkg = pyish_package(channel)
    before = json.loads((pkg.parent / "repodata.json").read_text())["packages.conda"][pkg.name]["sha256"]
    data = pkg.read_bytes()
    os.utime(pkg.parent / "repodata.json", ns=(time.time_ns() - 10**9,) * 2)
    pkg.write_bytes(data + b"\0")  # what a re-zipped, stamped package is to the indexer: new bytes
    reindex(channel)
    after = json.loads((pkg.parent / "repodata.json").read_text())["packages.conda"][pkg.name]
    assert after["sha256"] == hashlib.sha256(pkg.read_bytes()).hexdigest() != before
    assert after["size"] == len(data) + 1


def test_a_channel_index_others_planted_is_read_bounded_and_typed(tmp_path: Path) -> None:
    """A channel is a folder other admins write. A FIFO at linux-64/repodata.json: the old reader
    (`read_text`) waited on it for ever; a record without a name: `package_names` raised KeyError
    (a traceback from `extforge build`'s toolkit check). Now the FIFO is an unreadable index and the
    record is left out."""
    import os
    import subprocess
    import sys

    fifo, odd = tmp_path / "fifo", tmp_path / "odd"
    (fifo / "linux-64").mkdir(parents=True)
    os.mkfifo(fifo / "linux-64" / "repodata.json")
    (odd / "linux-64").mkdir(parents=True)
    (odd / "linux-64" / "repodata.json").write_text(json.dumps({"packages.conda": {
        "a-1-0.conda": {"version": "1", "build": "0"}, "b-1-0.conda": {"name": "b", "version": "1", "build": "0"},
        "c-1-0.conda": "not a record"}}))
    code = ("import sys; from extforge.channel_ref import package_names, repodata_mentions; "
            "print(sorted(package_names(sys.argv[1:3], 'linux-64')), repodata_mentions([sys.argv[1]], '__cuda'))")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo), str(odd)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['b']", "False"]


def test_a_planted_record_whose_depends_is_no_list_never_decides_a_wheels_pin(tmp_path: Path) -> None:
    """`extforge build --wheel` pins a requirement on a package built per torch to the versions the
    build's channels and output folder (which others may write) hold for its torch
    (requirements.built_for_rows). A record there whose `depends` was a number: main raised
    TypeError ("failed unexpectedly" after the whole build); a string was read letter by letter.
    Now such an entry is no record: left out, the well-formed one still counts."""
    out = tmp_path / "out"
    (out / "linux-64").mkdir(parents=True)
    pin = ["pytorch ==2.14.1 cuda130_py312_h0_0"]
    (out / "linux-64" / "repodata.json").write_text(json.dumps({"packages.conda": {
        "causal-conv1d-9.9.9-0.conda": {"name": "causal-conv1d", "version": "9.9.9", "build": "0", "depends": 5},
        "causal-conv1d-9.9.8-0.conda": {"name": "causal-conv1d", "version": "9.9.8", "build": "0", "depends": "abc"},
        "causal-conv1d-1.5.0-0.conda": {"name": "causal-conv1d", "version": "1.5.0", "build": "0", "depends": pin}}}))
    from extforge.channel_ref import all_records
    from extforge.wheel.requirements import built_for_rows

    assert built_for_rows(all_records([out])) == {"torch2.14.1-cu130": {"causal-conv1d": ["1.5.0"]}}
