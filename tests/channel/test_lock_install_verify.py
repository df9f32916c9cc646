"""lock → install → verify with real packages on a loopback HTTP channel; tampering and
crafted archives refused."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cli_run import EXTFORGE
from extforge.archive import check_package, unsafe_reason
from extforge.environment import verify as verify_mod
from extforge.environment.install import install_env
from extforge.environment.lock import lock
from extforge.environment.manifest import read_manifest
from extforge.environment.mirrors import site_mirrors
from extforge.environment.verify import verify_prefix
from extforge.errors import ExtforgeError
from extforge.publishing.index import reindex
from extforge.publishing.publish import publish

from .crafted import crafted_conda, crafted_tar_bz2

MANIFEST = """\
[workspace]
name = "t"
channels = ["internal"]
platforms = [{{ platform = "linux-64", cuda = "13.0" }}]

[feature.app.dependencies]
tiny-app = "*"

[feature.{extra}.dependencies]
{extra} = "*"

[environments]
app = ["app"]
{extra} = {{ features = ["{extra}"], no-default-feature = true }}
"""


def _workspace(tmp_path: Path, channel_url: str, extra: str = "tiny-05", envs: list[str] | None = None) -> tuple[Path, Path]:
    """A workspace whose channel `internal` is served at channel_url: a mirror in pixi's config form."""
    ws = tmp_path / "ws"
    (ws / ".pixi").mkdir(parents=True, exist_ok=True)
    (ws / "pixi.toml").write_text(MANIFEST.format(extra=extra))
    (ws / ".pixi" / "config.toml").write_text(f'[mirrors]\n"https://conda.anaconda.org/internal" = ["{channel_url}"]\n')
    lock(read_manifest(ws / "pixi.toml"), ws / "pixi.lock", site_mirrors(ws), envs)
    return ws / "pixi.toml", ws / "pixi.lock"


def _install(lock_path: Path, env: str, prefix: Path):
    return install_env(lock_path, env, prefix, mirrors=site_mirrors(lock_path.parent))


def _hashes_modulo_prefix(prefix: Path) -> dict[str, str]:
    import hashlib

    out = {}
    for p in sorted(prefix.rglob("*")):
        if p.is_file() and "conda-meta" not in p.parts:
            out[str(p.relative_to(prefix))] = hashlib.sha256(p.read_bytes().replace(str(prefix).encode(), b"$PREFIX")).hexdigest()
    return out


def test_lock_install_twice_identical_and_verify(tiny_packages, http_root, tmp_path, isolated_cache):
    root, url = http_root
    publish(tiny_packages.distinct[:6] + [tiny_packages.app], root / "internal", audit=False)
    manifest, lock_path = _workspace(tmp_path, f"{url}/internal")

    text = lock_path.read_text()
    assert "version: 7" in text and "https://conda.anaconda.org/internal/noarch/tiny-app-1.0-h0_0.conda" in text
    assert url not in text  # the lock names the channel, not this site's mirror of it
    # pixi writes its implicit `default` environment even when the default feature is empty.
    from rattler import LockFile

    assert sorted(name for name, _ in LockFile.from_path(lock_path).environments()) == ["app", "default", "tiny-05"]
    assert "  default:\n    channels:\n    - url: https://conda.anaconda.org/internal/\n    packages: {}\n" in text
    with pytest.raises(ExtforgeError, match="'default' of .* has no packages") as empty:
        _install(lock_path, "default", tmp_path / "envs" / "default")
    assert "app, tiny-05" in empty.value.fix and not (tmp_path / "envs" / "default").exists()
    explicit = (lock_path.parent / "envs" / "app.explicit.txt").read_text().splitlines()
    assert explicit[1:3] == ["# platform: linux-64", "@EXPLICIT"] and sum(line.startswith("https://conda.anaconda.org/internal/") and "#" in line for line in explicit) == 3
    assert "tiny-app=1.0=h0_0" in (lock_path.parent / "envs" / "app.environment.yml").read_text()

    a, b = tmp_path / "envs" / "a", tmp_path / "envs" / "b"
    for prefix in (a, b):
        proc = subprocess.run([*EXTFORGE, "install", "app", "--prefix", str(prefix), "--lock", str(lock_path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert (a / "share/tiny-app/where.txt").read_text() == f"installed in {a}\n"  # placeholder patched to the final path
    files_a = _hashes_modulo_prefix(a)
    assert files_a == _hashes_modulo_prefix(b)
    assert len([f for f in files_a if f.startswith("share/")]) == 6
    for prefix in (a, b):
        proc = subprocess.run([*EXTFORGE, "verify", str(prefix), "--env", "app", "--lock", str(lock_path), "--json"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        verdicts = {c["name"]: c["verdict"] for c in json.loads(proc.stdout)["checks"]}
        assert verdicts["packages"] == "pass" and verdicts["files"] == "pass"
    # Installing again into the same prefix is a no-op, into another env's prefix a refusal.
    assert _install(lock_path, "app", a).status == "already-installed"
    with pytest.raises(ExtforgeError, match="not empty"):
        _install(lock_path, "tiny-05", a)

    # Tampering on the node: verify names the file; a different env's lock flags the packages.
    (b / "share/tiny-01/data.txt").write_text("tampered\n")
    (b / "share/tiny-00/where.txt").unlink()
    report = verify_prefix(b, lock_path=lock_path, env="app")
    assert not report.ok and report.exit_code == 1
    findings = report.check("files").findings
    assert any(f.startswith("modified: share/tiny-01/data.txt (tiny-01)") for f in findings)
    assert any(f.startswith("missing: share/tiny-00/where.txt (tiny-00)") for f in findings)
    packages = verify_prefix(a, lock_path=lock_path, env="tiny-05").check("packages")
    assert packages.verdict == "fail" and any("missing: tiny-05" in f for f in packages.findings)


def test_lock_check_detects_staleness(tiny_packages, tmp_path):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:6] + [tiny_packages.app], channel, audit=False)
    manifest, lock_path = _workspace(tmp_path, channel.as_uri())
    check = [*EXTFORGE, "lock", "--manifest", str(manifest), "--check"]
    assert subprocess.run(check, capture_output=True).returncode == 0
    manifest.write_text(manifest.read_text().replace('tiny-app = "*"', 'tiny-app = ">=1.0"'))
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 1 and "environment 'app' changed" in proc.stderr
    proc = subprocess.run([*EXTFORGE, "install", "app", "--prefix", str(tmp_path / "p"), "--lock", str(lock_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "stale" in proc.stderr and not (tmp_path / "p").exists()


def test_an_install_on_a_short_disk_first_removes_the_unused_cache_entries(tiny_packages, tmp_path, isolated_cache):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:2] + [tiny_packages.app], channel, audit=False)
    _, lock_path = _workspace(tmp_path, channel.as_uri(), extra="tiny-01")
    stale = isolated_cache / "mirror" / "packages" / "0123abcd"  # a package of an older generation
    stale.mkdir(parents=True)
    (stale / "old.conda").write_bytes(os.urandom(2**20))
    month_ago = time.time() - 30 * 24 * 3600
    os.utime(stale, (month_ago, month_ago))
    # No disk has 10^9 GiB free: the install makes what room it can, says so and goes on.
    env = {**os.environ, "EXTFORGE_CACHE_MIN_FREE": "1e9"}
    proc = subprocess.run([*EXTFORGE, "install", "app", "--prefix", str(tmp_path / "p"), "--lock", str(lock_path)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (tmp_path / "p" / "conda-meta").is_dir()
    assert "before installing environment 'app'" in proc.stderr and "removed 1 cache entries" in proc.stderr, proc.stderr


def test_package_altered_after_locking_is_refused(tiny_packages, tmp_path, isolated_cache):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:6] + [tiny_packages.app], channel, audit=False)
    _, lock_path = _workspace(tmp_path, channel.as_uri())
    # Someone replaces tiny-00's bytes on the channel behind publish's back.
    (channel / "noarch" / tiny_packages.clash.name).write_bytes(tiny_packages.clash.read_bytes())
    prefix = tmp_path / "p"
    prefix.mkdir()  # an empty prefix stays empty
    with pytest.raises(ExtforgeError, match=r"differ from pixi.lock: tiny-00-1.0-h0_0.conda") as err:
        _install(lock_path, "app", prefix)
    assert err.value.exit_code == 1
    assert list(prefix.iterdir()) == [] and [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []


@pytest.mark.parametrize("kind", ["tar.bz2", "conda"])
def test_crafted_archives_are_refused(kind, tmp_path, isolated_cache):
    outside = tmp_path / "abs-escaped.txt"
    make = crafted_tar_bz2 if kind == "tar.bz2" else crafted_conda
    channel = tmp_path / "ch"
    (channel / "noarch").mkdir(parents=True)
    dotdot = make(channel / "noarch", "evil-dotdot", "../../escaped.txt")
    absolute = make(channel / "noarch", "evil-abs", str(outside))
    with pytest.raises(ExtforgeError, match="path leaves the prefix"):
        check_package(dotdot)
    with pytest.raises(ExtforgeError, match="absolute path"):
        check_package(absolute)
    reindex(channel)
    for name in ("evil-dotdot", "evil-abs"):
        _, lock_path = _workspace(tmp_path, channel.as_uri(), extra=name, envs=[name])
        prefix = tmp_path / "envs" / "p"
        with pytest.raises(ExtforgeError, match="unsafe"):
            _install(lock_path, name, prefix)
        assert not prefix.exists()
    assert not outside.exists() and not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()


RATTLER_ALONE = """
import asyncio, sys
from rattler import install, solve
channel, name, prefix, cache = sys.argv[1:]
records = asyncio.run(solve([channel], [name], platforms=["linux-64", "noarch"], virtual_packages=[]))
asyncio.run(install(records, prefix, cache_dir=cache, show_progress=False))
"""


@pytest.mark.parametrize("kind", ["tar.bz2", "conda"])
def test_rattler_alone_does_not_write_outside(kind, tmp_path):
    """What rattler's own extraction does with the same archives. extforge checks members
    itself because this depends on the rattler version (0.28 aborts the process on some)."""
    import sys

    make = crafted_tar_bz2 if kind == "tar.bz2" else crafted_conda
    channel = tmp_path / "ch"
    (channel / "noarch").mkdir(parents=True)
    outside = tmp_path / "abs-escaped.txt"
    make(channel / "noarch", "evil-dotdot", "../../escaped.txt")
    make(channel / "noarch", "evil-abs", str(outside))
    reindex(channel)
    outcomes = {}
    for name in ("evil-dotdot", "evil-abs"):
        proc = subprocess.run(
            [sys.executable, "-c", RATTLER_ALONE, channel.as_uri(), name, str(tmp_path / "deep" / "p"), str(tmp_path / "rc")],
            capture_output=True, text=True, timeout=120,
        )
        outcomes[name] = proc.returncode
    written = [p for p in tmp_path.rglob("escaped.txt") if "rc" not in p.parts and "deep" not in p.parts]
    print(f"\nrattler alone on crafted .{kind}: exit codes {outcomes}")
    assert not outside.exists() and not written


def test_unsafe_reason_rules():
    assert unsafe_reason("lib/libx.so") is None
    assert unsafe_reason("a/../b") is None
    assert unsafe_reason("a/../../b") == "path leaves the prefix (..)"
    assert unsafe_reason("/etc/passwd") == "absolute path"
    assert unsafe_reason("lib/link", "symlink", "../../../etc") == "symlink ../../../etc points outside the prefix"
    assert unsafe_reason("lib/link", "symlink", "libx.so.1") is None
    assert unsafe_reason("bin/x", "hardlink", "../outside")


def test_verify_rehashes_only_files_changed_since_a_clean_run(tiny_packages, http_root, tmp_path, isolated_cache,
                                                              monkeypatch):
    root, url = http_root
    publish(tiny_packages.distinct[:6] + [tiny_packages.app], root / "internal", audit=False)
    _, lock_path = _workspace(tmp_path, f"{url}/internal")
    prefix = tmp_path / "env"
    _install(lock_path, "app", prefix)

    first = verify_prefix(prefix, lock_path=lock_path, env="app")
    total = first.files_hashed
    assert first.ok and total > 0 and first.snapshot == "written"
    # Files changed within the window before the snapshot may share its timestamp tick: hashed again.
    monkeypatch.setattr(verify_mod, "RACY_FINE_NS", 10**15)
    assert verify_prefix(prefix, lock_path=lock_path, env="app").files_hashed == total
    monkeypatch.setattr(verify_mod, "RACY_FINE_NS", 0)
    quick = verify_prefix(prefix, lock_path=lock_path, env="app")
    assert quick.ok and quick.files_hashed == 0 and quick.files_unchanged == total

    # Same size, mtime set back: only ctime tells, and that is enough to re-hash the file.
    data = prefix / "share/tiny-01/data.txt"
    before = data.stat()
    data.write_bytes(bytes(b ^ 1 for b in data.read_bytes()))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert data.stat().st_size == before.st_size and data.stat().st_mtime_ns == before.st_mtime_ns
    caught = verify_prefix(prefix, lock_path=lock_path, env="app")
    assert not caught.ok and caught.files_hashed == 1
    assert any(f.startswith("modified: share/tiny-01/data.txt (tiny-01)") for f in caught.check("files").findings)
    assert verify_prefix(prefix, lock_path=lock_path, env="app", rehash=True).files_hashed == total
