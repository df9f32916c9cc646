"""End to end on the real mirror: lock python + pytorch, install twice, identical, verified."""

from __future__ import annotations

from pathlib import Path

import pytest

from extforge.environment.install import install_env
from extforge.environment.lock import lock
from extforge.environment.manifest import parse_manifest
from extforge.environment.mirrors import parse_channel_map
from extforge.environment.verify import verify_prefix
from extforge.hashing import hash_many

pytestmark = pytest.mark.slow

MANIFEST = """\
[workspace]
name = "e2e"
channels = ["conda-forge"]
platforms = [{ platform = "linux-64", cuda = "13.0" }]

[feature.torch.dependencies]
python = "3.11.*"
pytorch = "==2.14.1"

[environments]
torch = { features = ["torch"] }
"""


@pytest.fixture
def mirror(request) -> Path:
    try:
        return request.getfixturevalue("mirror_channel")
    except pytest.FixtureLookupError:
        pytest.skip("the mirror_channel fixture (tests/conftest.py) is not available in this checkout")


def _files(prefix: Path) -> list[Path]:
    return [p for p in prefix.rglob("*") if p.is_file() and not p.is_symlink() and "conda-meta" not in p.parts]


def test_torch_env_installed_twice_is_identical_and_verified_even_in_a_path_with_a_space(mirror, tmp_path):
    # python, pytorch, sympy and triton ship scripts whose shebang names the prefix: rattler
    # rewrites them for a path with a space, and install and verify must expect its form.
    (tmp_path / "pixi.toml").write_text(MANIFEST)
    manifest = parse_manifest(MANIFEST, tmp_path / "pixi.toml")
    mirrors = parse_channel_map([f"conda-forge={mirror.as_uri()}"], tmp_path, "test")
    result = lock(manifest, tmp_path / "pixi.lock", mirrors)
    assert result.environments["torch"] > 10
    # Two paths of one length: byte code holds its source's path in a length-prefixed string.
    a, b = tmp_path / "team envs" / "torch env a", tmp_path / "team envs" / "torch env b"
    for prefix in (a, b):
        installed = install_env(tmp_path / "pixi.lock", "torch", prefix, mirrors=mirrors)
        assert installed.cache_mismatches == []  # no false alarm, no shared cache entry dropped
    files_a = {p.relative_to(a) for p in _files(a)}
    assert files_a == {p.relative_to(b) for p in _files(b)}
    # Files that are hard links of one package-cache file in both are the same bytes by being one
    # inode (most of them, where the cache is on the prefixes' filesystem); the rest are hashed.
    # Files differ only where the install wrote its own prefix into them (placeholders).
    own = [f for f in files_a if (a / f).stat().st_ino != (b / f).stat().st_ino]
    ha, hb = hash_many([a / f for f in own]), hash_many([b / f for f in own])
    differing = [f for f in own if ha[a / f] != hb[b / f]]
    for f in differing:
        assert (a / f).read_bytes().replace(bytes(a), b"@P@") == (b / f).read_bytes().replace(bytes(b), b"@P@"), f
    scripts = [p for p in (a / "bin").iterdir() if p.is_file() and p.read_bytes().startswith(b"#!/bin/sh\n'''exec'")]
    assert scripts, "no python script of the env was rewritten for the space"
    for prefix, rehash in ((a, True), (b, False)):
        report = verify_prefix(prefix, lock_path=tmp_path / "pixi.lock", env="torch", rehash=rehash)
        assert report.ok, report.to_json()["checks"]
    print(f"\n{result.environments['torch']} packages, {len(files_a)} files identical in both prefixes "
          f"({len(differing)} differ only by the prefix path); verify {report.seconds:.1f} s for "
          f"{report.bytes_hashed / 1024**3:.2f} GiB")
