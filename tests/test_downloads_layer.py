"""Every download extforge makes itself goes through extforge.downloads (a size, a deadline on the
headers, the stall and rate rules), so an unbounded fetch cannot come back in new code: an HTTP
client used anywhere else in src/ fails this test. `recipe new` and `verify --lock` each had one
(an endless sdist filled a disk; verify read 3.7 GB for a small package)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "extforge"
LAYER = SRC / "downloads.py"

# Modules that fetch, and the names of the standard library's that do (urllib.request's
# url2pathname only turns a file URL into a path).
CLIENTS = {"http.client", "requests", "httpx", "urllib3", "aiohttp", "pycurl", "ftplib"}
FETCHING = {"urlopen", "urlretrieve", "build_opener", "OpenerDirector", "HTTPConnection", "HTTPSConnection",
            "create_connection"}


def fetches(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name in CLIENTS or a.name.split(".")[0] in CLIENTS]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in CLIENTS or node.module.split(".")[0] in CLIENTS:
                found.append((node.lineno, f"from {node.module} import"))
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names if a.name in FETCHING]
        elif isinstance(node, ast.Attribute) and node.attr in FETCHING:
            found.append((node.lineno, f".{node.attr}"))
    return found


def test_no_download_outside_the_bounded_fetcher() -> None:
    hits = [f"{path.relative_to(SRC)}:{line}: {what}" for path in sorted(SRC.rglob("*.py"))
            # data/ holds scripts that run inside a build env; the build layer's hook only refuses fetches.
            if path != LAYER and "data" not in path.relative_to(SRC).parts
            for line, what in fetches(ast.parse(path.read_text(), str(path)))]
    assert not hits, "download through extforge.downloads.fetch/download (bounded), not:\n" + "\n".join(hits)


def test_the_check_catches_each_way_to_fetch() -> None:
    code = """
import requests, http.client
from urllib.request import urlopen, url2pathname
from httpx import get
urllib.request.urlopen(u); socket.create_connection(a); x.HTTPConnection(h)
"""
    assert [what for _, what in fetches(ast.parse(code))] == [
        "import requests", "import http.client", "from urllib.request import urlopen", "from httpx import",
        ".urlopen", ".create_connection", ".HTTPConnection"]
