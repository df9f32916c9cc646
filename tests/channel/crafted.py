"""Hand-made malicious packages for the channel tests: one payload member at a bad path."""

from __future__ import annotations

from pathlib import Path

from security.crafted import craft_package, member


def crafted_tar_bz2(dest_dir: Path, name: str, bad_path: str) -> Path:
    return craft_package(dest_dir, name, [member(bad_path)], fmt="tar.bz2")


def crafted_conda(dest_dir: Path, name: str, bad_path: str) -> Path:
    return craft_package(dest_dir, name, [member(bad_path)], fmt="conda")
