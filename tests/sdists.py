"""A source archive written here from text files (an sdist, or upstream's archive of a tag)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def tar_gz(path: Path, top: str, files: dict[str, str]) -> Path:
    """`path`, a .tar.gz holding each of `files` (path -> text) below the folder `top`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path
