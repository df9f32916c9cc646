"""Content identities for cache keys, cheap enough that a warm mirror run takes seconds."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from .. import paths
from ..hashing import sha256_file as hash_file


def _memo_path() -> Path:
    return paths.cache_root() / "mirror" / "sha256-memo.json"


def sha256_file(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) so 3 GB of wheels hash once."""
    st = path.stat()
    memo_file = _memo_path()
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
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
