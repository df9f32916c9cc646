"""Stand-in wheels for mirror runs that need only the python packages: a wheel named torch holding
what the mirror reads of one."""

from __future__ import annotations

import zipfile
from pathlib import Path


def stand_in_torch(folder: Path, version: str, abi: int, cuda: str | None = None, body: str = "") -> Path:
    """torch `version` built for `cuda` (None: a CPU build): version.py and TorchConfig.cmake, and
    `body` in its __init__.py (another wheel of the same name and version)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    local = f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("torch/__init__.py", body)
        zf.writestr("torch/version.py", f"__version__ = '{version}+{local}'\ncuda = {cuda!r}\n")
        zf.writestr("torch/share/cmake/Torch/TorchConfig.cmake", f'set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI={abi}")\n')
        zf.writestr(f"torch-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        zf.writestr(f"torch-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
    return wheel
