"""Extraction budgets (archive.py, one rule for audit, publish and install): a decompression bomb,
an oversized metadata member or a name longer than Linux allows is refused from its tar header,
naming the member, before anything is written."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from extforge.archive import MAX_NAME_BYTES, PackageCheck, check_package
from extforge.errors import ExtforgeError

from .crafted import craft_bomb, craft_package, member

GIB = 2**30


def _refusal(path: Path) -> str:
    with pytest.raises(ExtforgeError) as err:
        check_package(path)
    return err.value.render()


@pytest.mark.parametrize("fmt", ["conda", "tar.bz2"])
def test_a_zero_bomb_is_refused_naming_its_member(tmp_path: Path, fmt: str) -> None:
    bomb = craft_bomb(tmp_path, "bomb", "lib/libbomb.so", GIB if fmt == "conda" else GIB // 4, fmt=fmt)
    assert bomb.stat().st_size < 2**20
    text = _refusal(bomb)
    assert "lib/libbomb.so" in text and "decompression bomb" in text and "declares" in text


def test_a_bomb_in_paths_json_is_refused_without_reading_it(tmp_path: Path) -> None:
    bomb = craft_bomb(tmp_path, "pjbomb", "info/paths.json", GIB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    text = _refusal(bomb)
    assert "info/paths.json" in text
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: not read into memory


def test_more_than_declared_is_refused_even_when_pkg_streams_before_info(tmp_path: Path) -> None:
    # Random bytes do not compress, so only the declared total (not the ratio cap) can refuse it.
    bomb = craft_bomb(tmp_path, "liar", "lib/liar.so", 80 * 2**20, random=True)
    check = PackageCheck(bomb)
    assert check.ratio_budget > 80 * 2**20
    text = _refusal(bomb)
    assert "lib/liar.so" in text and "info/paths.json declares" in text


def test_a_10000_character_member_name_is_refused(tmp_path: Path) -> None:
    long = "share/" + "x" * 10_000
    pkg = craft_package(tmp_path, "longname", [member(long)])
    text = _refusal(pkg)
    assert f"longer than the {MAX_NAME_BYTES} allowed" in text and "share/xxx" in text and len(text) < 1000
    component = craft_package(tmp_path / "c", "longpart", [member("share/" + "y" * 300 + "/f")])
    assert "255 a filesystem allows" in _refusal(component)


def test_real_sized_packages_pass(tmp_path: Path) -> None:
    pkg = craft_package(tmp_path, "fine", [member("lib/a.so", bytes(10 * 2**20)), member("share/" + "n" * 200)])
    assert check_package(pkg).name == "fine"


def test_audit_publish_and_install_refuse_a_bomb_writing_nothing(sandbox) -> None:
    bomb = craft_bomb(sandbox.path("in"), "bomb", "lib/libbomb.so", 4 * GIB)
    channel = sandbox.path("ch")
    with sandbox.unchanged_outside():
        sandbox.run("audit", str(bomb), "--json", expect=(1, 2)).refused("lib/libbomb.so", "decompression bomb")
        sandbox.run("publish", str(bomb), "--channel", str(channel), "--no-audit", expect=(1, 2)).refused("lib/libbomb.so")
    # Installed from a channel it reached anyway (copied in by hand, then indexed).
    from extforge.publishing.index import reindex

    (channel / "noarch").mkdir(exist_ok=True)
    bomb.rename(channel / "noarch" / bomb.name)
    reindex(channel)
    lock = sandbox.lock(channel, "bomb")
    prefix = sandbox.root / "envs" / "b"
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=(1, 2))
    res.refused("lib/libbomb.so", "decompression bomb")
    assert not prefix.exists()
    assert not any((sandbox.cache / "rattler").glob("**/libbomb.so"))


def test_install_checks_an_archive_once_and_believes_no_record_it_did_not_sign(sandbox, monkeypatch) -> None:
    import hashlib
    import json
    import os

    from extforge.environment import trust
    from extforge.publishing.index import reindex

    from .pyish import pyish_package

    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    checked = [json.loads(sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / name), "--lock",
                                      str(lock), "--json", expect=0).stdout)["archives_checked"] for name in ("a", "b")]
    assert checked == [1, 0]

    bomb = craft_bomb(sandbox.path("in"), "bomb", "lib/libbomb.so", 4 * GIB)
    sha = hashlib.sha256(bomb.read_bytes()).hexdigest()
    bomb.rename(channel / "noarch" / bomb.name)
    reindex(channel)
    lock = sandbox.lock(channel, "bomb")
    monkeypatch.setenv("EXTFORGE_CACHE", str(sandbox.cache))
    record = trust.trust_dir() / "checked" / f"{sha}.json"
    # A record someone else planted (they lack the user's key), then one the user's own key signed
    # under other extraction rules: neither spares the bomb its check.
    for plant in (lambda: record.write_bytes(b"0" * 64 + b"\n" + json.dumps({"sha256": sha, "rules": trust._rules_id()}).encode()),
                  lambda: trust.write_signed(record, {"sha256": sha, "rules": "0" * 64})):
        plant()
        prefix = sandbox.root / "envs" / "bomb"
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=(1, 2)).refused(
            "lib/libbomb.so", "decompression bomb")
        assert not prefix.exists() and os.path.exists(record)
