"""Downloads stop at the size the lock names (install's and verify's alike), time out on a server
that trickles its headers or stalls its body, and take only regular files from file:// (a symlink
to /dev/zero, a FIFO)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from servers import serving

from .pyish import pyish_package


def _locked(sandbox) -> tuple[Path, Path]:
    channel = sandbox.path("ch")
    pkg = pyish_package(channel)
    return sandbox.lock(channel, "pyish"), pkg


def test_an_endless_download_stops_at_the_locked_size(sandbox):
    lock, pkg = _locked(sandbox)
    prefix = sandbox.root / "envs" / "z"
    with serving("zeros") as (url, sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock),
                          "--channel-map", f"internal={url}/internal", expect=1, timeout=120)
    res.refused(f"lock size {pkg.stat().st_size} bytes", "gave more; stopped there")
    assert sent[0] < 64 * 2**20  # it stopped reading (the server only learns when its buffers fill)
    assert not prefix.exists()
    assert sum(f.stat().st_size for f in (sandbox.cache / "pkgs").rglob("*") if f.is_file()) < 2**20


def test_a_stalled_download_times_out_with_a_clear_error(sandbox):
    lock, _ = _locked(sandbox)
    prefix = sandbox.root / "envs" / "t"
    with serving("trickle") as (url, _sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--json",
                          "--channel-map", f"internal={url}/internal", env={"EXTFORGE_DOWNLOAD_STALL_SECONDS": "3"},
                          expect=2, timeout=120)
    # The refusal names the 3 s stall rule: that rule, not the 120 s timeout, ended the download.
    res.refused("stalled", "less than 64 KiB arrived in 3 s", "EXTFORGE_DOWNLOAD_STALL_SECONDS")
    assert '"error": "download of http://127.0.0.1' in res.stdout
    assert not prefix.exists()


def test_a_download_just_above_the_stall_rule_still_ends(sandbox):
    # 70 KiB every 0.9 s never trips a 1 s stall window; the package is 2 MiB, so without a
    # floor on the average rate this would run ~27 s and end in a sha256 mismatch.
    from extforge.publishing.index import reindex

    from .crafted import craft_package, member

    channel = sandbox.path("ch")
    craft_package(channel / "noarch", "bigish", [member("share/bigish/blob", os.urandom(2 << 20))])
    reindex(channel)
    lock = sandbox.lock(channel, "bigish")
    prefix = sandbox.root / "envs" / "slow"
    start = time.monotonic()
    with serving("slowloris") as (url, _sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--channel-map",
                          f"internal={url}/internal", env={"EXTFORGE_DOWNLOAD_STALL_SECONDS": "1"}, expect=2, timeout=120)
    assert time.monotonic() - start < 15
    res.refused("is too slow", "KiB/s a download must average", "EXTFORGE_DOWNLOAD_MIN_KIB_PER_S")
    assert not prefix.exists()


def test_verify_stops_an_endless_download_at_the_locked_size(sandbox, pyish_env):
    """verify --lock fetches a package whose manifest it has not read yet; the old code passed
    it no size (its PackageRef named the sha256 alone) and read what the server sent, here
    until the server gave up at 256 MiB (1.5-3.7 GB in 12 s from a real one)."""
    lock, prefix = pyish_env
    for made in ("pkgs", f"trust-{os.getuid()}/manifests"):
        for path in sorted((sandbox.cache / made).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
    size = json.loads(next((prefix / "conda-meta").glob("pyish-*.json")).read_text())["size"]
    with serving("zeros") as (url, sent):
        res = sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", "--json",
                          "--channel-map", f"internal={url}/internal", expect=1, timeout=120)
    res.refused(f"lock size {size} bytes", "gave more; stopped there")
    assert sent[0] < 64 * 2**20


def test_a_server_trickling_its_headers_times_out(sandbox):
    """A status line and headers a byte a second: the stall and rate rules start only at the
    body, and the old code's socket timeout counts from the last byte, so install waited for as
    long as the server went on (here until it gave up after 30 s)."""
    lock, _ = _locked(sandbox)
    prefix = sandbox.root / "envs" / "h"
    start = time.monotonic()
    with serving("headers", seconds=30) as (url, _sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--channel-map",
                          f"internal={url}/internal", env={"EXTFORGE_DOWNLOAD_HEADER_SECONDS": "2"}, expect=2, timeout=120)
    assert time.monotonic() - start < 15
    res.refused("did not start", "no complete answer (status line and headers) came in 2 s", "EXTFORGE_DOWNLOAD_HEADER_SECONDS")
    assert not prefix.exists()


@pytest.mark.parametrize(("name", "value"), [("EXTFORGE_DOWNLOAD_STALL_SECONDS", "-1"), ("EXTFORGE_DOWNLOAD_STALL_SECONDS", "inf"),
                                             ("EXTFORGE_DOWNLOAD_STALL_SECONDS", "nan"), ("EXTFORGE_DOWNLOAD_MIN_KIB_PER_S", "x"),
                                             ("EXTFORGE_DOWNLOAD_HEADER_SECONDS", "0"), ("EXTFORGE_DOWNLOAD_MAX_MIB", "-5")])
def test_a_bad_download_setting_is_refused(sandbox, name, value):
    lock, _ = _locked(sandbox)
    res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "p"), "--lock", str(lock),
                      "--channel-map", "internal=http://127.0.0.1:9/internal", env={name: value}, expect=2)
    res.refused(f"${name}={value!r} is not a")


def test_file_urls_take_only_regular_files(sandbox):
    lock, pkg = _locked(sandbox)
    mirror = sandbox.path("mirror", "noarch")
    (mirror / pkg.name).symlink_to("/dev/zero")
    res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "e1"), "--lock", str(lock),
                      "--channel-map", f"internal={mirror.parent.as_uri()}", expect=2, timeout=60)
    res.refused("it is not a regular file", "/dev/zero")
    (mirror / pkg.name).unlink()
    os.mkfifo(mirror / pkg.name)
    res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "e2"), "--lock", str(lock),
                      "--channel-map", f"internal={mirror.parent.as_uri()}", expect=2, timeout=60)
    res.refused("it is not a regular file")
    assert not (sandbox.root / "e1").exists() and not (sandbox.root / "e2").exists()
