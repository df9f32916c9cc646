"""Hand-made malicious packages: members with ../ or absolute paths (no build tool makes these)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import zstandard

PAYLOAD = b"written outside the prefix\n"


def _tar(members: dict[str, bytes], compression: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}" if compression else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _info(name: str, bad_path: str) -> dict[str, bytes]:
    index = {"name": name, "version": "1.0", "build": "0", "build_number": 0, "depends": [],
             "subdir": "noarch", "noarch": "generic", "timestamp": 1700000000000}
    paths = {"paths_version": 1, "paths": [{"_path": bad_path, "path_type": "hardlink",
             "sha256": hashlib.sha256(PAYLOAD).hexdigest(), "size_in_bytes": len(PAYLOAD)}]}
    return {"info/index.json": json.dumps(index).encode(), "info/paths.json": json.dumps(paths).encode()}


def crafted_tar_bz2(dest_dir: Path, name: str, bad_path: str) -> Path:
    path = dest_dir / f"{name}-1.0-0.tar.bz2"
    path.write_bytes(_tar({**_info(name, bad_path), bad_path: PAYLOAD}, "bz2"))
    return path


def crafted_conda(dest_dir: Path, name: str, bad_path: str) -> Path:
    path = dest_dir / f"{name}-1.0-0.conda"
    zstd = zstandard.ZstdCompressor()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        zf.writestr(f"info-{name}-1.0-0.tar.zst", zstd.compress(_tar(_info(name, bad_path))))
        zf.writestr(f"pkg-{name}-1.0-0.tar.zst", zstd.compress(_tar({bad_path: PAYLOAD})))
    return path
