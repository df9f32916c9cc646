"""Content identities for cache keys, cheap enough that a warm mirror run takes seconds."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from .. import paths, shared_read
from ..hashing import sha256_file as hash_file

# ~150 bytes a wheel: thousands of wheels fit many times over.
_MEMO_LIMIT = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STAMP = re.compile(r"[0-9]{1,20}:[0-9]{1,30}")


def _memo_entries(data: object) -> dict[str, list[str]]:
    """The memo's entries, each a path's [stamp, sha256]; malformed ones are left out."""
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    return {path: hit for path, hit in data.items() if isinstance(hit, list) and len(hit) == 2
            and isinstance(hit[0], str) and _STAMP.fullmatch(hit[0]) and isinstance(hit[1], str) and _SHA256.fullmatch(hit[1])}


def _memo_path() -> Path:
    return paths.own_area("mirror") / "sha256-memo.json"


def sha256_file(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) so 3 GB of wheels hash once."""
    st = path.stat()
    memo_file = _memo_path()
    try:
        memo = shared_read.read_json(memo_file, _memo_entries, limit=_MEMO_LIMIT)
    except (FileNotFoundError, shared_read.Refused):
        memo = {}  # rewritten below with this digest: the others are hashed again once
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    hit = memo.get(str(path))
    if hit and hit[0] == stamp:
        return hit[1]
    digest = hash_file(path)
    memo[str(path)] = [stamp, digest]
    memo_file.parent.mkdir(parents=True, exist_ok=True)
    # Per thread: the seed fixture fetches a row's wheels while another row is packaged. Two
    # writers can still drop each other's entry, which only costs a second hash later.
    tmp = memo_file.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(memo))
    tmp.replace(memo_file)
    return digest


def stat_identity(files: Iterable[list[str]]) -> str:
    """Identity of installed files by (src, dst, flags, size, mtime): a reinstall changes it."""
    h = hashlib.sha256()
    for src, dst, flags in files:
        try:
            st = os.lstat(src)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{src}\0{dst}\0{flags}\0{stamp}\n".encode())
    return h.hexdigest()


def text_identity(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()
