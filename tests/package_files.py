"""A member of a built .conda, read without extracting it (tests of what a build put in its package)."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import zstandard


def package_member(conda: Path, name: str) -> bytes:
    """A payload file, or with an `info/` name, a metadata file (info/index.json)."""
    part = "info-" if name.startswith("info/") else "pkg-"
    with zipfile.ZipFile(conda) as zf:
        member = next(n for n in zf.namelist() if n.startswith(part) and n.endswith(".tar.zst"))
        raw = zstandard.ZstdDecompressor().stream_reader(zf.open(member))
        with tarfile.open(fileobj=raw, mode="r|") as tf:
            for entry in tf:
                if entry.name == name:
                    f = tf.extractfile(entry)
                    assert f is not None
                    return f.read()
    raise AssertionError(f"no {name} in {conda}")
