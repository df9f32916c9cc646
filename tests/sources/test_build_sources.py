"""`extforge build` reads a recipe's sources from the source cache `extforge sources fetch` fills,
with no variable set, and fetches what it lacks itself (verified) before rattler-build runs:
real rattler-build builds of a recipe whose only other URL cannot be reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from build_logs import build_log
from extforge.cli import main
from extforge.recipes import sources
from sources.test_sources import _recipe, _sdist, _sha

UNREACHABLE = "https://example.invalid/tinypkg-1.0.tar.gz"


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty channel to build against, this user's cache in tmp_path, no EXTFORGE_SOURCES, and
    pip reaching only a local folder holding the sdist."""
    channel = tmp_path / "channel"
    (channel / "noarch").mkdir(parents=True)
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(sources.ENV, raising=False)
    sdist = _sdist(tmp_path / "index")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(sdist.parent))
    return channel, sdist


def _build(recipe: Path, channel: Path, out: Path) -> int:
    return main(["build", str(recipe), "-c", str(channel), "-o", str(out), "--no-test", "--no-audit", "--json"])


def test_a_build_reads_the_default_source_cache_and_fills_it_first(tmp_path: Path, site: tuple[Path, Path], capsys) -> None:
    """The old code rendered the recipe's `file://${EXTFORGE_SOURCES}/...` as /nonexistent without
    the variable, and rattler-build downloaded the next URL (here: unreachable, so it failed)."""
    channel, sdist = site
    recipe = _recipe(tmp_path / "recipe", _sha(sdist), UNREACHABLE)
    assert _build(recipe, channel, tmp_path / "out") == 0, capsys.readouterr().err
    stored = tmp_path / "cache" / "sources" / "sha256" / _sha(sdist) / sdist.name
    assert stored.read_bytes() == sdist.read_bytes()
    text = build_log(tmp_path / "out", "recipe").read_text()
    assert stored.as_uri() in text and UNREACHABLE not in text.split("# env", 1)[1]
    assert [p["name"] for p in json.loads(capsys.readouterr().out)["packages"]] == ["tinypkg"]

    # What `extforge sources fetch` stored is what the next build reads: offline, pip finds nothing.
    sdist.unlink()
    assert _build(recipe, channel, tmp_path / "out2") == 0


def test_a_source_the_build_would_download_is_refused(tmp_path: Path, site: tuple[Path, Path], capsys) -> None:
    channel, sdist = site
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text(
        f"schema_version: 1\npackage: {{name: tinypkg, version: '1.0'}}\nsource:\n  url: {UNREACHABLE}\n"
        f"  sha256: {_sha(sdist)}\nbuild: {{noarch: generic, script: [echo]}}\n")
    assert _build(recipe, channel, tmp_path / "out") == 2
    err = json.loads(capsys.readouterr().out)
    assert err["error"].endswith(f"its source {UNREACHABLE} would be downloaded by rattler-build during the build")
    assert f"/sha256/{_sha(sdist)}/tinypkg-1.0.tar.gz` (as `extforge recipe new` writes it)" in err["fix"]
    assert not (tmp_path / "out" / "bld").exists()


def test_a_source_no_one_can_fetch_names_the_command_that_fills_the_cache(tmp_path: Path, site: tuple[Path, Path],
                                                                          monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    channel, sdist = site
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    recipe = _recipe(tmp_path / "recipe", _sha(sdist), UNREACHABLE)
    assert _build(recipe, channel, tmp_path / "out") == 2
    err = json.loads(capsys.readouterr().out)
    assert err["error"] == "could not get tinypkg-1.0.tar.gz for tinypkg==1.0"
    assert f"`extforge sources fetch {recipe} --dest {tmp_path / 'cache' / 'sources'}`" in err["fix"]
