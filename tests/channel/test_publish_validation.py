"""Publish validates before it touches the channel: identities by conda's rules, one file per
identity in every subdir and format, a damaged repodata.json rebuilt, and no write through a
symlink someone with write access to the channel planted. Each refusal leaves the channel as
it was (a before/after listing of every file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.publishing.publish import LOG_NAME, publish
from security.crafted import craft_package


def _listing(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = f"-> {p.readlink()}"
        elif p.is_file():
            out[key] = p.read_bytes()
    return out


def _indexed(channel: Path, subdir: str = "noarch") -> set[str]:
    data = json.loads((channel / subdir / "repodata.json").read_text())
    return set(data.get("packages.conda", {})) | set(data.get("packages", {}))


@pytest.mark.parametrize(
    ("index", "words"),
    [
        ({"name": "../evil"}, "name '../evil'"),
        ({"version": "1.0/../../x"}, "version '1.0/../../x'"),
        ({"build": "0;id"}, "build string '0;id'"),
        ({"name": "evil$(id)"}, "name 'evil$(id)'"),
        ({"version": "2.0"}, "its file name says 'evil-1.0-0'"),
    ],
)
def test_identities_a_channel_cannot_serve_are_refused(index, words, tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:1], channel, audit=False)
    before = _listing(channel)
    bad = craft_package(tmp_path / "crafted", "evil", index=index)
    with pytest.raises(ExtforgeError) as err:
        publish([bad], channel, audit=False)
    assert words in err.value.why and err.value.exit_code == 1
    assert _listing(channel) == before


@pytest.mark.parametrize(("subdir", "fmt"), [("linux-64", "conda"), ("noarch", "tar.bz2")])
def test_an_identity_in_the_channel_is_refused_in_another_subdir_or_format(subdir, fmt, tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    published = tiny_packages.distinct[1]
    publish([published], channel, audit=False)
    before = _listing(channel)
    name, version, build = published.name.removesuffix(".conda").rsplit("-", 2)
    twin = craft_package(tmp_path / "crafted", name, version=version, build=build, subdir=subdir, fmt=fmt)
    with pytest.raises(ExtforgeError, match=f"{name}-{version}-{build} is already in .* as noarch/{published.name}") as err:
        publish([twin], channel, audit=False)
    assert err.value.exit_code == 1
    assert _listing(channel) == before


@pytest.mark.parametrize("damage", [b"", b'{"info": {"subdir": "noarch"}, "packages.conda": {"tiny', b"[]",
                                    b'{"packages.conda": {"../../x.conda": {}}}'])
def test_a_damaged_repodata_is_rebuilt_and_reported(damage, tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    first, second, third = tiny_packages.distinct[6:9]
    publish([first], channel, audit=False)
    (channel / "noarch" / "repodata.json").write_bytes(damage)
    result = publish([second], channel, audit=False)
    assert result.repodata_rebuilt == ["noarch"]
    assert _indexed(channel) == {first.name, second.name}
    # and the channel keeps working: the next publish carries the rebuilt index on
    assert publish([third], channel, audit=False).repodata_rebuilt == []
    assert _indexed(channel) == {first.name, second.name, third.name}


def test_the_publish_log_is_never_written_through_a_symlink(tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    victim = tmp_path / "victim.sh"
    victim.write_text("echo sourced\n")
    publish(tiny_packages.distinct[9:10], channel, audit=False)
    (channel / LOG_NAME).unlink()
    (channel / LOG_NAME).symlink_to(victim)
    before = _listing(tmp_path)
    with pytest.raises(ExtforgeError, match="symbolic link"):
        publish(tiny_packages.distinct[10:11], channel, audit=False)
    assert _listing(tmp_path) == before


def test_the_publish_lock_is_never_created_through_a_symlink(tiny_packages, tmp_path):
    channel, outside = tmp_path / "ch", tmp_path / "outside"
    channel.mkdir()
    outside.mkdir()
    (channel / ".extforge-publish.lock").symlink_to(outside / "planted")
    with pytest.raises(ExtforgeError, match="symbolic link"):
        publish(tiny_packages.distinct[11:12], channel, audit=False)
    assert list(outside.iterdir()) == []
    assert not (channel / "noarch").exists()


def test_a_failed_reindex_leaves_the_channel_as_it_was(tiny_packages, tmp_path, monkeypatch):
    from extforge.publishing import index

    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[12:13], channel, audit=False)
    # A package copied in by hand (the publish log gets a repair entry for it), then an indexer
    # that fails (unreadable files no longer make it fail: they are left out).
    craft_package(channel / "linux-64", "by-hand")
    before = _listing(channel)

    def failing_indexer(folder):
        raise ExtforgeError(f"could not index the channel folder {folder}", "the indexer exited with 1", "")

    monkeypatch.setattr(index, "index_fs", failing_indexer)
    with pytest.raises(ExtforgeError, match="could not index the channel folder"):
        publish(tiny_packages.distinct[13:14], channel, audit=False)
    # Neither the package nor the log entries (its own, and the repair entry) stay behind.
    assert _listing(channel) == before


def test_a_package_symlinked_into_the_channel_is_never_served(tiny_packages, tmp_path):
    """A link in a subdir could serve a file its publisher never published (a member's link to
    another's private package) and cannot be checked against the publish log: the re-index
    leaves it out and names it, and the link stays as it was."""
    channel = tmp_path / "ch"
    store = tmp_path / "store"
    stored = craft_package(store, "stored")
    publish(tiny_packages.distinct[14:15], channel, audit=False)
    (channel / "noarch" / stored.name).symlink_to(stored)
    result = publish(tiny_packages.distinct[15:16], channel, audit=False)
    assert _indexed(channel) == {tiny_packages.distinct[14].name, tiny_packages.distinct[15].name}
    assert result.ignored == [f"noarch/{stored.name}: it is a symbolic link or not a regular file"]
    assert (channel / "noarch" / stored.name).is_symlink()
