"""`extforge sources fetch/path` with real pip against a local sdist (no network)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from extforge.cli import main
from extforge.recipes import sources
from servers import serving

SETUP_PY = "from setuptools import setup\nsetup(name='tinypkg', version='1.0', py_modules=[])\n"


def _sdist(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tinypkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {
            "tinypkg-1.0/setup.py": SETUP_PY,
            "tinypkg-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _recipe(where: Path, sha256: str, url: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "recipe.yaml").write_text(
        "schema_version: 1\n"
        "package: {name: tinypkg, version: '1.0'}\n"
        "source:\n  url:\n"
        "    - file://${{ env.get('EXTFORGE_SOURCES', default='/nonexistent') }}/sha256/" + sha256 + "/tinypkg-1.0.tar.gz\n"
        f"    - {url}\n"
        f"  sha256: {sha256}\n"
        "build: {noarch: generic, script: [echo]}\n"
    )
    return where


@pytest.fixture()
def sdist(tmp_path: Path, monkeypatch) -> Path:
    path = _sdist(tmp_path / "index")
    # Real pip, local find-links only: the test never needs the network.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(path.parent))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_with_pip_stores_by_sha256_and_path_finds_it(tmp_path: Path, sdist: Path, capsys) -> None:
    recipe = _recipe(tmp_path / "recipe", _sha(sdist), "https://example.invalid/tinypkg-1.0.tar.gz")
    dest = tmp_path / "shared" / "sources"
    assert main(["sources", "fetch", str(recipe), "--dest", str(dest), "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)["sources"]
    stored = dest / "sha256" / _sha(sdist) / "tinypkg-1.0.tar.gz"
    assert out["how"] == "pip" and Path(out["path"]) == stored
    assert stored.read_bytes() == sdist.read_bytes()
    assert main(["sources", "path", str(recipe), "--dest", str(dest)]) == 0
    assert capsys.readouterr().out.strip() == str(stored)
    # A second fetch reuses the verified file.
    assert sources.fetch(sources.read_spec(recipe), dest) == (stored, "cached")


def test_wrong_hash_is_an_error_and_nothing_is_stored(tmp_path: Path, sdist: Path, capsys) -> None:
    wrong = "0" * 64
    recipe = _recipe(tmp_path / "recipe", wrong, "https://example.invalid/tinypkg-1.0.tar.gz")
    dest = tmp_path / "store"
    assert main(["sources", "fetch", str(recipe), "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "sha256 mismatch" in err and _sha(sdist) in err and "nothing was stored" in err
    assert [p for p in dest.rglob("*") if p.is_file()] == []
    assert main(["sources", "path", str(recipe), "--dest", str(dest)]) == 2


def test_falls_back_to_recipe_url_when_pip_cannot_get_it(tmp_path: Path, monkeypatch) -> None:
    # Like flash-attn, whose setup.py imports torch: pip cannot prepare it; the recipe URL can.
    elsewhere = _sdist(tmp_path / "elsewhere")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    recipe = _recipe(tmp_path / "recipe", _sha(elsewhere), elsewhere.as_uri())
    path, how = sources.fetch(sources.read_spec(recipe), tmp_path / "store")
    assert how == "url" and path.read_bytes() == elsewhere.read_bytes()


def test_flash_attn_recipe_spec() -> None:
    spec = sources.read_spec(Path(__file__).resolve().parents[2] / "recipe" / "flash-attn")
    assert spec.pip_requirement == "flash-attn==2.8.3"
    assert spec.filename == "flash_attn-2.8.3.tar.gz"
    assert spec.sha256 == "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
    assert spec.urls[-1].startswith("https://")


FA3 = Path(__file__).resolve().parents[2] / "recipe" / "flash-attn-3"
SHARED_SOURCES = Path(__file__).resolve().parents[3] / "shared" / "sources"


def test_flash_attn_3_recipe_pins_both_archives_and_pip_is_not_asked() -> None:
    specs = sources.read_specs(FA3)
    assert [s.filename for s in specs] == ["flash-attention-0251105a-hopper.tar.gz", "cutlass-7127592-include.tar.gz"]
    assert all(len(s.sha256) == 64 and not s.is_sdist for s in specs)
    assert sources.read_spec(Path(__file__).resolve().parents[2] / "recipe" / "flash-attn").is_sdist


@pytest.mark.skipif(not SHARED_SOURCES.is_dir(), reason="the project's ../shared/sources folder is not beside the checkout")
def test_flash_attn_3_sources_from_a_folder_then_cached(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "store"
    assert main(["sources", "fetch", str(FA3), "--from", str(SHARED_SOURCES), "--dest", str(dest), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["sources"]
    assert [g["how"] for g in got] == ["folder", "folder"]
    for g in got:
        assert _sha(Path(g["path"])) == g["sha256"] and Path(g["path"]).stat().st_mode & 0o777 == 0o644
    assert main(["sources", "path", str(FA3), "--dest", str(dest)]) == 0
    assert capsys.readouterr().out.split() == [g["path"] for g in got]
    # Nothing to fetch the second time, the folder is not needed.
    assert main(["sources", "fetch", str(FA3), "--dest", str(dest), "--json"]) == 0
    assert [g["how"] for g in json.loads(capsys.readouterr().out)["sources"]] == ["cached", "cached"]


def test_a_tampered_archive_in_the_folder_is_refused(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "site-sources"
    folder.mkdir()
    for spec in sources.read_specs(FA3):
        (folder / spec.filename).write_bytes(b"not the pinned archive")
    dest = tmp_path / "store"
    assert main(["sources", "fetch", str(FA3), "--from", str(folder), "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "sha256 mismatch for flash-attention-0251105a-hopper.tar.gz" in err and "nothing was stored" in err
    assert [p for p in dest.rglob("*") if p.is_file()] == []


def test_missing_archive_names_where_it_looked(tmp_path: Path, capsys) -> None:
    assert main(["sources", "fetch", str(FA3), "--from", str(tmp_path), "--dest", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "could not get flash-attention-0251105a-hopper.tar.gz" in err and "--from DIR" in err
    assert "pip download" not in err


def test_a_url_ending_in_no_file_name_is_refused(tmp_path: Path, capsys) -> None:
    """The last URL names the stored file: rendered, `…/..` is `…/`, whose file name the old code
    took to be empty (`sources path` printed the sha256 folder itself)."""
    for url in ("https://example.invalid/..", "https://example.invalid/dir/"):
        recipe = _recipe(tmp_path / "recipe", "0" * 64, url)
        for action in ("path", "fetch"):
            assert main(["sources", action, str(recipe), "--dest", str(tmp_path / "store")]) == 2
            err = capsys.readouterr().err
            assert "names no file" in err and "'' is not a plain file name" in err, err
    assert not (tmp_path / "store").exists()


def test_an_endless_source_download_stops_at_the_cap(tmp_path: Path, monkeypatch, capsys) -> None:
    """A recipe's source URL has no size anywhere: the old code read until the server stopped
    (here at 64 MiB), then refused the bytes for their sha256."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    monkeypatch.setenv("EXTFORGE_DOWNLOAD_MAX_MIB", "1")
    with serving("zeros", most=64 * 2**20) as (url, sent):
        recipe = _recipe(tmp_path / "recipe", "0" * 64, f"{url}/tinypkg-1.0.tar.gz")
        assert main(["sources", "fetch", str(recipe), "--dest", str(tmp_path / "store"), "-v"]) == 2
    err = capsys.readouterr().err
    assert "is larger than 1 MiB" in err and "could not get tinypkg-1.0.tar.gz" in err, err
    assert sent[0] < 32 * 2**20 and [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
