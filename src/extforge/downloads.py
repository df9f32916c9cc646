"""Every download extforge makes itself (a lock's packages, an sdist and its index's JSON, a
recipe's source archives) goes through `fetch`, with the same four bounds:

- size: at most the bytes a lock or an index names (more raises TooBig: the caller says whose
  number it broke), or, where nothing names a size, `$EXTFORGE_DOWNLOAD_MAX_MIB` (an endless
  body once filled the disk);
- connect and the answer's status line and headers within `$EXTFORGE_DOWNLOAD_HEADER_SECONDS`: a
  server trickling its headers a byte a second defeats a socket timeout, which counts from the
  last byte, and the body's rules below start only once the headers are in;
- the body: at least STALL_BYTES every `$EXTFORGE_DOWNLOAD_STALL_SECONDS`, and, past that first
  window, an average of `$EXTFORGE_DOWNLOAD_MIN_KIB_PER_S`;
- the sha256 compared where the caller knows it (`download`), before the file takes its name.

A local source (a file:// URL or a path) is read only if it is a regular file: /dev/zero or a
FIFO never gives a package. Each failure is one ExtforgeError naming the URL and the setting.
What other programs fetch (rattler's repodata and rattler-build's sources, pip) has their bounds.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from .errors import ExtforgeError
from .safe_files import atomic_writer

# A transfer that delivers less than STALL_BYTES in this many seconds is stalled (a server that
# trickles one byte every 20 s defeats a plain socket timeout, which counts from the last byte).
STALL_ENV = "EXTFORGE_DOWNLOAD_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 60.0
STALL_BYTES = 64 * 1024
# A server can keep just above the stall rule for ever (65 KiB every 59 s: ten days for 1 GB):
# past the first stall window a transfer must also average this many KiB/s overall.
MIN_RATE_ENV = "EXTFORGE_DOWNLOAD_MIN_KIB_PER_S"
DEFAULT_MIN_RATE_KIB = 256.0
HEADER_ENV = "EXTFORGE_DOWNLOAD_HEADER_SECONDS"
DEFAULT_HEADER_SECONDS = 60.0
# A download no lock or index gives a size for (a size-less lock record, an sdist from an index
# that lists none): the largest conda package of a torch env is ~2 GB.
MAX_ENV = "EXTFORGE_DOWNLOAD_MAX_MIB"
DEFAULT_MAX_MIB = 4096.0
_CHUNK = 1024 * 1024
# A socket timeout beyond a day is no setting anyone means (and `inf` overflows the timeout).
_MAX_SECONDS = 24 * 3600.0
_MAX_MIB = float(2**20)


def _setting(name: str, default: float, what: str, *, allow_zero: bool = False, most: float = _MAX_SECONDS) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not (0 <= value <= most if allow_zero else 0 < value <= most):
        raise ExtforgeError(f"${name}={raw!r} is not {what}", f"it must be a {'non-negative' if allow_zero else 'positive'} "
                            f"number up to {most:.0f}", f"set it to such a number (default {default:g}) or unset it")
    return value


@dataclass(frozen=True)
class Limits:
    """The bounds of one download, from the environment (docs/reliability.md names each case)."""

    headers: float  # seconds from connecting to the last header line
    stall: float  # seconds in which STALL_BYTES must arrive
    floor: float  # bytes/s a transfer must average past its first stall window (0: none)
    most: int  # bytes a download of unknown size may bring

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            headers=_setting(HEADER_ENV, DEFAULT_HEADER_SECONDS, "a number of seconds"),
            stall=_setting(STALL_ENV, DEFAULT_STALL_SECONDS, "a number of seconds"),
            floor=_setting(MIN_RATE_ENV, DEFAULT_MIN_RATE_KIB, "a rate in KiB/s", allow_zero=True) * 1024,
            most=int(_setting(MAX_ENV, DEFAULT_MAX_MIB, "a size in MiB", most=_MAX_MIB) * 2**20),
        )


class TooBig(Exception):
    """The source gave more bytes than the size the caller named (the lock's, the index's)."""


class Mismatch(Exception):
    """The bytes' sha256 is not the one the caller named; nothing was written."""

    def __init__(self, got: str) -> None:
        super().__init__(got)
        self.got = got


class _Stalled(Exception):
    pass


class _TooSlow(Exception):
    pass


class _Unwritten(Exception):
    """Writing the bytes failed (a full disk): the OSError is the writer's to report, not the source's."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _Deadline:
    """Shuts the socket of the connection it watches once `seconds` have passed in running(): a
    recv blocked on a server that trickles its headers then returns, and fetch says why."""

    def __init__(self, seconds: float) -> None:
        self.hit = False
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
            if self.hit:
                raise TimeoutError("no answer in time")

    def _expire(self) -> None:
        with self._lock:
            self.hit = True
            sock = self._conn.sock if self._conn is not None else None
            if sock is not None:
                # The plain socket's shutdown, also under TLS: SSLSocket's own drops its state
                # under the thread reading it.
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # closed already

    @contextmanager
    def running(self) -> Iterator[None]:
        self._timer.start()
        try:
            yield
        finally:
            self._timer.cancel()


class _WatchedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, *, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        self._deadline.watch(self)
        super().connect()
        self._deadline.watch(self)  # a deadline passed while the socket was being made


class _WatchedHTTPS(_WatchedHTTP, http.client.HTTPSConnection):
    pass


def _watched(kind: type[_WatchedHTTP], deadline: _Deadline) -> Callable[..., http.client.HTTPConnection]:
    def connection(host: str, /, **kwargs: Any) -> http.client.HTTPConnection:
        return kind(host, deadline=deadline, **kwargs)

    return connection


class _Handler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """urllib's http and https handlers (it uses this one for both) with watched connections."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(_WatchedHTTP, self._deadline), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(_WatchedHTTPS, self._deadline), req)


# A file name taken from a URL or an index: one component of a fixed character set, so `..`, an
# empty name (a URL ending in `/` or `/..`), a `/`, a newline or a space never reach a path or a recipe.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]*")


def file_name_reason(name: str) -> str | None:
    """Why `name`, taken from a URL or an index, cannot be the name of a file written, or None."""
    if _FILE_NAME.fullmatch(name) and len(name.encode()) <= 255:
        return None
    return (f"{name!r} is not a plain file name (one path component of letters, digits and . _ + ~ -, "
            "starting with a letter or digit, at most 255 bytes)")


def url_file_name(url: str) -> str:
    """The file name a URL ends in, refused unless file_name_reason passes it."""
    name = urlparse(url).path.rsplit("/", 1)[-1]
    if (why := file_name_reason(name)) is not None:
        raise ExtforgeError(f"the URL {url} names no file", why, "end the URL with the file's name (…/NAME-VERSION.tar.gz)")
    return name


def local_path(url: str) -> str | None:
    """The file a file:// URL or a plain path names; None for a network URL."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return url if parsed.scheme == "" else None


def open_regular(path: str | Path, url: str) -> BinaryIO:
    """path opened for reading if it is a regular file (O_NONBLOCK: a FIFO must not hang the open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExtforgeError(
            f"cannot fetch {url}: it is not a regular file",
            "a download names a file; a device (such as /dev/zero), a FIFO or a folder never gives one",
            "point the URL (a lock's channel, its mirror, an index) at real files",
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def _pump(read: Callable[[int], bytes], out: BinaryIO | None, url: str, limit: int, limits: Limits) -> str:
    """sha256 of what read() gives (copied to out): at most `limit` bytes, never stalling, and
    averaging at least limits.floor bytes/s once a stall window has passed."""
    h = hashlib.sha256()
    total = mark_bytes = 0
    start = mark_time = time.monotonic()
    while chunk := read(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise TooBig(url, limit)
        h.update(chunk)
        if out is not None:
            try:
                out.write(chunk)
            except OSError as exc:
                raise _Unwritten(exc) from None
        now = time.monotonic()
        if total - mark_bytes >= STALL_BYTES:
            mark_time, mark_bytes = now, total
        elif now - mark_time > limits.stall:
            raise _Stalled
        if now - start > limits.stall and total < limits.floor * (now - start):
            raise _TooSlow(total, now - start)
    return h.hexdigest()


def _http(url: str, out: BinaryIO | None, limit: int, limits: Limits) -> str:
    deadline = _Deadline(limits.headers)
    opener = urllib.request.build_opener(_Handler(deadline))
    try:
        with deadline.running():
            resp = opener.open(url, timeout=limits.stall)
    except Exception:
        if deadline.hit:
            raise ExtforgeError(
                f"download of {url} did not start",
                f"no complete answer (status line and headers) came in {limits.headers:g} s",
                f"check the server or mirror; on a slow link raise ${HEADER_ENV} (now {limits.headers:g})",
            ) from None
        raise
    with resp:
        if resp.length is not None and resp.length > limit:
            raise TooBig(url, limit)  # said by its Content-Length: nothing is read
        return _pump(resp.read1, out, url, limit, limits)


def fetch(url: str, out: BinaryIO | None, *, size: int | None = None, limits: Limits | None = None,
          path: Path | None = None, elsewhere: str = "") -> str:
    """Copy what url holds to out (None: only hash it) and return its sha256.

    size: the most bytes it may have (the lock's, the index's, a caller's own bound); more raises
    TooBig. Without one, a download past limits.most is refused. path: a local copy of url to
    read in its place (a hard link the caller made), named as url in every error. elsewhere: how
    to fetch it from another place, for the error when this one cannot be reached."""
    limits = limits or Limits.from_env()
    limit = size if size is not None else limits.most
    local = str(path) if path is not None else local_path(url)
    scheme = urlparse(url).scheme
    if local is None and scheme not in ("http", "https"):
        raise ExtforgeError(f"cannot fetch {url}", f"extforge downloads http, https and file URLs, not {scheme}",
                            "name the file by one of those")
    try:
        if local is not None:
            with open_regular(local, url) as src:
                return _pump(src.read, out, url, limit, limits)
        return _http(url, out, limit, limits)
    except _Unwritten as exc:
        raise exc.error from None
    except TooBig:
        if size is not None:
            raise
        raise ExtforgeError(
            f"download of {url} is larger than {limits.most / 2**20:g} MiB",
            "no lock or index names its size, and a download of unknown size stops there",
            f"check the URL names the file meant; for a larger one raise ${MAX_ENV}",
        ) from None
    except (_Stalled, TimeoutError):
        raise ExtforgeError(
            f"download of {url} stalled",
            f"less than {STALL_BYTES // 1024} KiB arrived in {limits.stall:g} s",
            f"check the server or mirror; on a slow link raise ${STALL_ENV} (now {limits.stall:g})",
        ) from None
    except _TooSlow as exc:
        got, seconds = exc.args
        raise ExtforgeError(
            f"download of {url} is too slow",
            f"{got // 1024} KiB in {seconds:.0f} s, less than the {limits.floor / 1024:g} KiB/s a download must average",
            f"check the server or mirror; on a slow link lower ${MIN_RATE_ENV} (0: no floor)",
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ExtforgeError(
            f"cannot fetch {url}",
            str(exc) or type(exc).__name__,
            "check that the server is reachable from this node" + (f", or {elsewhere}" if elsewhere else ""),
        ) from exc


def download(url: str, dest: Path, *, size: int | None = None, sha256: str | None = None,
             beneath: Path | None = None, elsewhere: str = "") -> str:
    """url's bytes at dest (through an exclusive temporary renamed over it, no link followed below
    `beneath`), bounded as fetch says; their sha256. With `sha256`, bytes that differ raise
    Mismatch and dest is left as it was."""
    with atomic_writer(dest, tmp_prefix="part-", beneath=beneath) as out:
        got = fetch(url, out, size=size, elsewhere=elsewhere)
        if sha256 is not None and got != sha256:
            raise Mismatch(got)
    return got
