"""Publish refusals and the audit gate, with real packages and extforge's real audit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_run import EXTFORGE
from extforge.errors import ExtforgeError
from extforge.publishing.publish import LOG_NAME, parse_channel, publish


def test_same_name_different_bytes_is_refused(tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:2], channel, audit=False)
    before = (channel / "noarch" / "repodata.json").read_bytes()
    with pytest.raises(ExtforgeError, match="is already in .* with different content") as err:
        publish([tiny_packages.distinct[2], tiny_packages.clash], channel, audit=False)
    assert err.value.exit_code == 1
    # The whole batch is refused: tiny-02 was not published either.
    assert (channel / "noarch" / "repodata.json").read_bytes() == before
    assert not (channel / "noarch" / tiny_packages.distinct[2].name).exists()
    again = publish(tiny_packages.distinct[:1], channel, audit=False)
    assert again.packages[0].status == "already-present"
    assert oct((channel / "noarch" / tiny_packages.distinct[0].name).stat().st_mode & 0o777) == "0o644"


def test_audit_gate_refuses_then_logs_the_override(tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    pkg = tiny_packages.distinct[3]  # no ELF inside: the extension audit fails it
    proc = subprocess.run([*EXTFORGE, "publish", str(pkg), "--channel", str(channel)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "failed its audit" in proc.stderr
    assert not (channel / "noarch" / pkg.name).exists()
    proc = subprocess.run(
        [*EXTFORGE, "publish", str(pkg), "--channel", channel.as_uri(), "--allow-audit-failure", "fixture without ELF", "--json"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["packages"][0]["audit_override"] == "fixture without ELF"
    (entry,) = [json.loads(line) for line in (channel / LOG_NAME).read_text().splitlines()]
    assert entry["audit"] == "fail" and entry["audit_override"] == "fixture without ELF"
    assert entry["file"] == f"noarch/{pkg.name}"


def test_a_built_package_that_fails_its_audit_is_kept_aside_out_of_the_output_channel(tiny_packages, tmp_path):
    """rattler-build indexes its output folder as it builds: a package left there would be locked
    and installed from a channel that `extforge build -o` made, its failed audit unseen."""
    import shutil

    from extforge.building.build import REJECTED_DIR, BuiltPackage, after_build
    from extforge.publishing.index import index_channel

    out = tmp_path / "output"
    (out / "noarch").mkdir(parents=True)
    built = shutil.copy2(tiny_packages.distinct[4], out / "noarch")  # no ELF inside: the audit fails it
    index_channel(out)
    assert tiny_packages.distinct[4].name in (out / "noarch" / "repodata.json").read_text()
    pkg = BuiltPackage(Path(built), "tiny-04", "1.0", "h0_0", "noarch")
    after_build([pkg], [])
    index_channel(out)
    assert pkg.audit_verdict == "fail" and pkg.path == out / REJECTED_DIR / tiny_packages.distinct[4].name
    assert pkg.path.is_file() and not (out / "noarch" / pkg.path.name).exists()
    assert pkg.path.name not in (out / "noarch" / "repodata.json").read_text()


def test_channel_kinds():
    assert parse_channel("/nfs/conda/ch") == ("folder", "/nfs/conda/ch")
    assert parse_channel("file:///nfs/conda/ch") == ("folder", "/nfs/conda/ch")
    assert parse_channel("https://prefix.dev/my-channel") == ("prefix", "https://prefix.dev/my-channel")
    assert parse_channel("quetz+https://q.example/ch") == ("quetz", "https://q.example/ch")
    with pytest.raises(ExtforgeError, match="cannot publish"):
        parse_channel("http://127.0.0.1:8000/channel")


def test_a_planted_file_that_is_no_package_is_not_served_and_blocks_no_publish(tiny_packages, tmp_path):
    """Anyone who can write a shared channel folder can put files in it; rattler's indexer
    panicked on the first unreadable one ("Could not find EOCD") and failed every publish."""
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:1], channel, audit=False)
    noarch = channel / "noarch"
    (noarch / "junk-1.0-0.conda").write_bytes(b"junk")
    real = tiny_packages.distinct[2].read_bytes()
    (noarch / "cut-1.0-h0_0.conda").write_bytes(real[: len(real) // 2])
    (noarch / "junk-1.0-0.tar.bz2").write_bytes(b"BZh9 not really")
    out = subprocess.run([*EXTFORGE, "publish", str(tiny_packages.distinct[1]), "--channel", str(channel),
                          "--no-audit", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [p["status"] for p in result["packages"]] == ["published"]
    assert sorted(i.split(":")[0] for i in result["ignored"]) == [
        "noarch/cut-1.0-h0_0.conda", "noarch/junk-1.0-0.conda", "noarch/junk-1.0-0.tar.bz2"]
    served = json.loads((noarch / "repodata.json").read_text())
    assert sorted(served["packages.conda"]) == sorted(p.name for p in tiny_packages.distinct[:2])
    assert served["packages"] == {}
    text = subprocess.run([*EXTFORGE, "publish", str(tiny_packages.distinct[1]), "--channel", str(channel),
                           "--no-audit"], capture_output=True, text=True)
    assert text.returncode == 0 and "3 file(s) in the channel are not served" in text.stderr
    assert "Traceback" not in text.stderr + text.stdout


def test_a_second_index_trusts_the_entries_the_first_wrote(tiny_packages, tmp_path):
    """Indexing links every package into a shadow folder and unlinks it, which moves their ctime;
    the repodata must then be dated strictly after (the kernel's clock is coarse), else the next
    publish or mirror reads every package of the channel again (~3 GB for a torch row)."""
    from extforge.publishing.index import carry_fresh_entries

    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:3], channel, audit=False)
    for _ in range(3):
        publish([tiny_packages.distinct[3]], channel, audit=False)  # an index run each, idempotent after the first
        sub = channel / "noarch" if (channel / "noarch" / "repodata.json").exists() else channel / "linux-64"
        written = (sub / "repodata.json").lstat().st_mtime_ns
        packages = [p for p in sub.iterdir() if p.name.endswith((".conda", ".tar.bz2"))]
        assert packages and all(p.lstat().st_ctime_ns < written for p in packages)
        assert carry_fresh_entries(sub, tmp_path / "carried.json") == {p.name for p in packages}
