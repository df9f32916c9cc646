"""The wheel index: PEP 503/691 pages per torch row, written under the channel's publish rules
(one identity per file name, a lock, atomic writes, no link followed, pages from the log).
Before these, extforge had no wheel index: `extforge publish` wrote conda channels only."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from crafted_ext import extension, extension_package, torch_env, torch_package

from extforge.errors import ExtforgeError
from extforge.publishing.index import index_channel
from extforge.wheel.index import LOG_NAME, publish_wheels
from extforge.wheel.make import Wheel, wheel_from_conda
from peers import peer_site  # noqa: F401  (the multi-user fixture, shared with other areas)
from pip_clients import clean_client_env

ROW = "torch2.14.1-cu130"


def _wheel(tmp: Path, name: str, source: str = 'extern "C" int f(int x) { return x + 1; }\n') -> Wheel:
    env = torch_env(tmp / name)
    return wheel_from_conda(extension_package(tmp / name / "pkg", extension(tmp / name, env, source)), tmp / name / "out", env)


def _listing(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def test_the_index_serves_pep503_and_pep691_pages_with_every_hash(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "a")
    old = os.umask(0o077)
    try:
        result = publish_wheels([(wheel, "pass")], tmp_path / "index")
    finally:
        os.umask(old)
    project = tmp_path / "index" / ROW / "simple" / "demo-x"
    assert [(w.file, w.status) for w in result.wheels] == [(f"{ROW}/simple/demo-x/{wheel.path.name}", "published")]
    assert (project / wheel.path.name).read_bytes() == wheel.path.read_bytes()
    quoted = wheel.path.name.replace("+", "%2B")
    page = (project / "index.html").read_text()
    # PEP 658/714, as PyPI writes them: the METADATA beside the wheel, its hash under both names.
    with zipfile.ZipFile(wheel.path) as zf:
        metadata = zf.read(f"{wheel.path.name.split('-')[0]}-{wheel.version}.dist-info/METADATA")
    assert (project / f"{wheel.path.name}.metadata").read_bytes() == metadata
    core = hashlib.sha256(metadata).hexdigest()
    assert (f'<a href="{quoted}#sha256={wheel.sha256}" data-requires-python="==3.11.*" data-dist-info-metadata="sha256={core}" '
            f'data-core-metadata="sha256={core}">{wheel.path.name}</a>') in page
    document = json.loads((project / "index.json").read_text())
    assert document == {"meta": {"api-version": "1.1"}, "name": "demo-x", "versions": ["1.0+cu130torch2.14cxx11abiTRUE"],
                        "files": [{"filename": wheel.path.name, "url": quoted, "hashes": {"sha256": wheel.sha256},
                                   "requires-python": "==3.11.*", "size": wheel.path.stat().st_size,
                                   "core-metadata": {"sha256": core}, "data-dist-info-metadata": {"sha256": core}}]}
    assert '<a href="demo-x/">demo-x</a>' in (project.parent / "index.html").read_text()
    assert json.loads((project.parent / "index.json").read_text())["projects"] == [{"name": "demo-x"}]
    # Readable by every node whatever the publisher's umask (077 here).
    for path in (project / wheel.path.name, project / f"{wheel.path.name}.metadata", project / "index.html", project / "index.json"):
        assert path.stat().st_mode & 0o777 == 0o644


def test_a_wheel_name_published_with_other_bytes_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    first = _wheel(tmp_path, "a")
    other = _wheel(tmp_path, "b", 'extern "C" int f(int x) { return x + 2; }\n')
    assert (other.path.name, other.sha256 != first.sha256) == (first.path.name, True)
    index = tmp_path / "index"
    publish_wheels([(first, "pass")], index)
    again = publish_wheels([(first, "pass")], index)
    assert [w.status for w in again.wheels] == ["already-present"]
    before = _listing(index)
    with pytest.raises(ExtforgeError) as err:
        publish_wheels([(other, "pass")], index)
    assert err.value.exit_code == 1 and "already in" in err.value.what and "with other bytes" in err.value.what
    assert _listing(index) == before


def test_a_huge_sparse_file_planted_at_a_wheels_name_is_refused_unread(tmp_path: Path) -> None:
    """Someone who can write the index plants a 64 GiB sparse file at the wheel's name. main hashed
    whatever lay there by path after an lstat (sha256_file): a minute of zeros read under the
    index's lock (and a FIFO swapped in after the lstat hung it). Now it is read by the one
    reader, bounded by the wheel's own size: refused from its size at once, as other bytes."""
    wheel = _wheel(tmp_path, "a")
    project = tmp_path / "index" / ROW / "simple" / "demo-x"
    project.mkdir(parents=True)
    with (project / wheel.path.name).open("wb") as planted:
        planted.truncate(1 << 36)
    start = time.monotonic()
    with pytest.raises(ExtforgeError) as err:
        publish_wheels([(wheel, "pass")], tmp_path / "index")
    assert time.monotonic() - start < 10
    assert "with other bytes" in err.value.what and "no regular file of its size" in err.value.why


def test_a_link_planted_in_the_index_is_not_followed(tmp_path: Path) -> None:
    """Someone who can write the index folder plants the row's folder as a link elsewhere."""
    wheel = _wheel(tmp_path, "a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / ROW).symlink_to(elsewhere)
    with pytest.raises(ExtforgeError, match="refusing to"):
        publish_wheels([(wheel, "pass")], tmp_path / "index")
    assert list(elsewhere.iterdir()) == []


def test_a_wheel_no_publish_vouches_for_is_not_listed(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "a")
    project = tmp_path / "index" / ROW / "simple" / "demo-x"
    project.mkdir(parents=True)
    planted = project / "demo_x-9.9-cp311-cp311-manylinux_2_5_x86_64.whl"
    planted.write_bytes(b"not a wheel")
    result = publish_wheels([(wheel, "pass")], tmp_path / "index")
    assert planted.name not in (project / "index.html").read_text()
    assert result.ignored == [f"{ROW}/simple/demo-x/{planted.name}"]


def test_group_members_publish_wheels_into_one_index(peer_site, tmp_path: Path) -> None:  # noqa: F811
    """Two admins of a site (real users of one group, umask 077 and 022) publish with the real CLI
    into one index folder set up as docs/site-admin.md says; the index stays theirs to share."""
    site = peer_site
    first, second = site.peers
    channel = site.root / "torch-channel"
    torch_package(channel)
    index_channel(channel)
    env = torch_env(tmp_path)
    pkgs = site.readable_copy([extension_package(tmp_path / v, extension(tmp_path / v, env), version=v) for v in ("1.0", "1.1")])
    index = site.shared_folder("wheels")
    for peer, pkg, umask in ((first, pkgs[0], 0o077), (second, pkgs[1], 0o022)):
        proc = site.run(peer, "publish", str(pkg), "--wheels", str(index), "--upstream", str(channel), "--no-audit", umask=umask)
        assert proc.returncode == 0, proc.stderr
    project = index / ROW / "simple" / "demo-x"
    wheels = sorted(project.glob("*.whl"))
    assert [w.name.split("-")[1] for w in wheels] == ["1.0+cu130torch2.14cxx11abiTRUE", "1.1+cu130torch2.14cxx11abiTRUE"]
    assert [w.stat().st_uid for w in wheels] == [first.uid, second.uid]
    page = (project / "index.html").read_text()
    assert all(w.name in page for w in wheels)
    for folder in (index / ROW, index / ROW / "simple", project):
        assert (folder.stat().st_gid, stat.S_IMODE(folder.stat().st_mode)) == (site.gid, 0o2775), folder
    for path in [*wheels, project / "index.html", project / "index.json"]:
        assert path.stat().st_mode & 0o044 == 0o044, f"{path.name} is not readable by the group and the cluster"
    log = index / LOG_NAME
    assert stat.S_IMODE(log.stat().st_mode) == 0o664
    assert [json.loads(line)["user"] for line in log.read_text().splitlines()] == [first.name, second.name]


def _dry_run(pip: Path, index: Path, report: Path) -> subprocess.CompletedProcess[str]:
    """pip's resolution of demo-x from the row's index, nothing installed."""
    return subprocess.run([str(pip), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--report",
                           str(report), "-v", "--index-url", (index / ROW / "simple").as_uri(), "demo-x"],
                          capture_output=True, text=True, timeout=300, env=clean_client_env())


def test_pip_resolves_from_the_metadata_file_without_the_wheel(tmp_path: Path, fixtures_dir: Path) -> None:
    """PEP 658: pip (from PyPI) resolves the project from `<wheel>.metadata` alone; the wheel is
    taken away first, so a resolver that needed it fails. The old index wrote no .metadata and
    announced none: pip had to fetch the wheel, and with it gone the dry run failed."""
    from channel.pip_envs import pip_client

    wheel = _wheel(tmp_path, "a")
    index = tmp_path / "index"
    publish_wheels([(wheel, "pass")], index)
    (index / ROW / "simple" / "demo-x" / wheel.path.name).unlink()
    report = tmp_path / "report.json"
    proc = _dry_run(pip_client(fixtures_dir), index, report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{wheel.path.name.replace('+', '%2B')}.metadata" in proc.stdout, proc.stdout
    (item,) = json.loads(report.read_text())["install"]
    assert item["metadata"]["version"] == "1.0+cu130torch2.14cxx11abiTRUE"
    assert item["metadata"]["requires_dist"][0] == "torch==2.14.1"
    assert item["download_info"]["archive_info"]["hashes"]["sha256"] == wheel.sha256


def test_a_wheel_published_before_the_index_had_metadata_files_gets_its_own(tmp_path: Path) -> None:
    """An index an older extforge wrote (no .metadata, no hash in its log): publishing the same
    wheel again adds its METADATA file and announces it; a .metadata that is gone is never announced."""
    wheel = _wheel(tmp_path, "a")
    index = tmp_path / "index"
    publish_wheels([(wheel, "pass")], index)
    project = index / ROW / "simple" / "demo-x"
    metadata = project / f"{wheel.path.name}.metadata"
    metadata.unlink()
    log = index / LOG_NAME
    log.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "metadata_sha256"}) + "\n"
                           for line in log.read_text().splitlines()))
    env = torch_env(tmp_path / "b")
    newer = wheel_from_conda(extension_package(tmp_path / "b" / "pkg", extension(tmp_path / "b", env), version="1.1"),
                             tmp_path / "b" / "out", env)
    publish_wheels([(newer, "pass")], index)  # the row's pages written again
    (line,) = [x for x in (project / "index.html").read_text().splitlines() if f">{wheel.path.name}<" in x]
    assert "metadata" not in line
    again = publish_wheels([(wheel, "pass")], index)
    assert [w.status for w in again.wheels] == ["already-present"]
    assert metadata.read_bytes() == wheel.metadata
    page = (project / "index.html").read_text()
    assert page.count(f'data-core-metadata="sha256={hashlib.sha256(wheel.metadata).hexdigest()}"') == 1


def test_a_metadata_file_swapped_in_the_index_is_refused_by_pip(tmp_path: Path, fixtures_dir: Path) -> None:
    """Someone who can write the index folder rewrites a wheel's .metadata without its torch pin
    (pip would then resolve the wheel beside any torch): the page announces the hash publish
    logged, so pip refuses the file and installs nothing."""
    from channel.pip_envs import pip_client

    wheel = _wheel(tmp_path, "a")
    index = tmp_path / "index"
    publish_wheels([(wheel, "pass")], index)
    metadata = index / ROW / "simple" / "demo-x" / f"{wheel.path.name}.metadata"
    metadata.write_bytes(metadata.read_bytes().replace(b"Requires-Dist: torch==2.14.1\n", b""))
    proc = _dry_run(pip_client(fixtures_dir), index, tmp_path / "report.json")
    assert proc.returncode != 0
    assert "hash" in proc.stdout + proc.stderr and metadata.name.replace("+", "%2B") in proc.stdout + proc.stderr
    assert not (tmp_path / "report.json").exists()
