"""A channel folder is the same folder however it is named: path, file:// URL with %20 / %23."""

from __future__ import annotations

import asyncio
from pathlib import Path

from extforge.channel.index import reindex
from extforge.channel.publish import parse_channel
from extforge.channel_ref import channel_url, listing, local_folder, package_names, repodata_mentions
from extforge.variants import CHANNEL_VARIANTS, channel_files

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
