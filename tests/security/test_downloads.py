"""Downloads stop at the size the lock names, time out on a stalled transfer, and take only
regular files from file:// (a symlink to /dev/zero, a FIFO)."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .pyish import pyish_package


def _locked(sandbox) -> tuple[Path, Path]:
    channel = sandbox.path("ch")
    pkg = pyish_package(channel)
    return sandbox.lock(channel, "pyish"), pkg


@contextmanager
def serving(body: str) -> Iterator[tuple[str, list[int]]]:
    """An HTTP server answering every GET with `body`: "zeros" (endless, no Content-Length),
    "trickle" (one byte a second) or "slowloris" (70 KiB every 0.9 s: just above a 1 s stall
    window's 64 KiB); yields its URL and the bytes sent so far."""
    sent = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    chunk = {"zeros": bytes(64 * 1024), "trickle": b"x", "slowloris": bytes(70 * 1024)}[body]
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent[0] += len(chunk)
                    if body != "zeros":
                        time.sleep(1 if body == "trickle" else 0.9)
            except OSError:
                pass  # the client stopped reading

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/internal", sent
    finally:
        server.shutdown()
        server.server_close()


def test_an_endless_download_stops_at_the_locked_size(sandbox):
    lock, pkg = _locked(sandbox)
    prefix = sandbox.root / "envs" / "z"
    with serving("zeros") as (url, sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock),
                          "--channel-map", f"internal={url}", expect=1, timeout=120)
    res.refused(f"lock size {pkg.stat().st_size} bytes", "gave more; stopped there")
    assert sent[0] < 64 * 2**20  # it stopped reading (the server only learns when its buffers fill)
    assert not prefix.exists()
    assert sum(f.stat().st_size for f in (sandbox.cache / "pkgs").rglob("*") if f.is_file()) < 2**20


def test_a_stalled_download_times_out_with_a_clear_error(sandbox):
    lock, _ = _locked(sandbox)
    prefix = sandbox.root / "envs" / "t"
    with serving("trickle") as (url, _sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--json",
                          "--channel-map", f"internal={url}", env={"EXTFORGE_DOWNLOAD_STALL_SECONDS": "3"},
                          expect=2, timeout=120)
    # The refusal names the 3 s stall rule: that rule, not the 120 s timeout, ended the download.
    res.refused("stalled", "less than 64 KiB arrived in 3 s", "EXTFORGE_DOWNLOAD_STALL_SECONDS")
    assert '"error": "download of http://127.0.0.1' in res.stdout
    assert not prefix.exists()


def test_a_download_just_above_the_stall_rule_still_ends(sandbox):
    # 70 KiB every 0.9 s never trips a 1 s stall window; the package is 2 MiB, so without a
    # floor on the average rate this would run ~27 s and end in a sha256 mismatch.
    from extforge.channel.index import reindex

    from .crafted import craft_package, member

    channel = sandbox.path("ch")
    craft_package(channel / "noarch", "bigish", [member("share/bigish/blob", os.urandom(2 << 20))])
    reindex(channel)
    lock = sandbox.lock(channel, "bigish")
    prefix = sandbox.root / "envs" / "slow"
    start = time.monotonic()
    with serving("slowloris") as (url, _sent):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--channel-map",
                          f"internal={url}", env={"EXTFORGE_DOWNLOAD_STALL_SECONDS": "1"}, expect=2, timeout=120)
    assert time.monotonic() - start < 15
    res.refused("is too slow", "KiB/s a download must average", "EXTFORGE_DOWNLOAD_MIN_KIB_PER_S")
    assert not prefix.exists()


@pytest.mark.parametrize(("name", "value"), [("EXTFORGE_DOWNLOAD_STALL_SECONDS", "-1"), ("EXTFORGE_DOWNLOAD_STALL_SECONDS", "inf"),
                                             ("EXTFORGE_DOWNLOAD_STALL_SECONDS", "nan"), ("EXTFORGE_DOWNLOAD_MIN_KIB_PER_S", "x")])
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
