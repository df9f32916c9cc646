"""HTTP servers on 127.0.0.1 that answer as a broken or hostile server would, for the tests of
extforge's download bounds. Each stops sending by itself (a byte budget, a time budget), so a
client without the bound under test ends too, and the test fails instead of hanging."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# Bodies that never end on their own: endless zeros (no Content-Length), a byte a second, 70 KiB
# every 0.9 s (just above a 1 s stall window's 64 KiB), and the status line and headers a byte a second.
HOSTILE = ("zeros", "trickle", "slowloris", "headers")


@contextmanager
def serving(routes: str | Mapping[str, bytes | str], *, most: int = 256 * 2**20,
            seconds: float = 60) -> Iterator[tuple[str, list[int]]]:
    """Serve `routes`: one body for every GET, or {path: body} (404 elsewhere; the mapping is read
    at each request, so a test may fill it once it knows the URL). A body is bytes, or one of
    HOSTILE: "zeros" stops after `most` bytes, the timed ones after `seconds`. Yields the root
    URL (no trailing slash) and the bytes sent so far."""
    sent = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            body = routes if isinstance(routes, str) else routes.get(self.path.split("?")[0])
            if body is None:
                self.send_error(404)
            elif isinstance(body, bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._hostile(body)

        def _hostile(self, body: str) -> None:
            start = time.monotonic()
            if body == "headers":
                chunks: Iterator[bytes] = (bytes([b]) for b in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"a" * 10**5)
            else:
                self.send_response(200)
                self.end_headers()
                chunk = {"zeros": bytes(64 * 1024), "trickle": b"x", "slowloris": bytes(70 * 1024)}[body]
                chunks = iter(lambda: chunk, b"")
            try:
                for chunk in chunks:
                    if sent[0] >= most or time.monotonic() - start > seconds:
                        return
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent[0] += len(chunk)
                    if body != "zeros":
                        time.sleep(0.9 if body == "slowloris" else 1)
            except OSError:
                pass  # the client stopped reading

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()
