"""Fake machines for doctor's probes: directories of scripts that print real tool output.

Formats: nvcc --version of CUDA 11.5 (the Ubuntu 22.04 /usr/bin/nvcc that shadows newer
toolkits), 12.8 and 13.0 (the 13.0 banner was captured on the development machine);
nvidia-smi of an H100 node with driver 580.65.06 (the CUDA 13.0 driver), banner layout of
the R550+ drivers, and its --query-gpu csv.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

# Absolute, so the fakes work under a PATH that holds only the fake directories.
CAT = shutil.which("cat") or "/bin/cat"

NVCC_BANNERS = {
    "11.5": (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2021 NVIDIA Corporation\n"
        "Built on Thu_Nov_18_09:45:30_PST_2021\n"
        "Cuda compilation tools, release 11.5, V11.5.119\n"
        "Build cuda_11.5.r11.5/compiler.30672275_0\n"
    ),
    "12.8": (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Fri_Feb_21_20:23:50_PST_2025\n"
        "Cuda compilation tools, release 12.8, V12.8.93\n"
        "Build cuda_12.8.r12.8/compiler.35583870_0\n"
    ),
    "13.0": (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\n"
        "Cuda compilation tools, release 13.0, V13.0.88\n"
        "Build cuda_13.0.r13.0/compiler.36424714_0\n"
    ),
}

SMI_H100_BANNER = """\
Sat Nov 22 10:14:03 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |
| N/A   28C    P0             71W /  700W |       1MiB /  81559MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""
SMI_H100_QUERY = "NVIDIA H100 80GB HBM3, 9.0, 580.65.06\n"


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_nvcc(path: Path, version: str) -> Path:
    return write_script(path, f"{CAT} <<'EOF'\n{NVCC_BANNERS[version]}EOF\n")


def fake_toolkit(root: Path, version: str) -> Path:
    """A CUDA toolkit directory as the runfile installs it: bin/nvcc and include/cuda_runtime.h."""
    fake_nvcc(root / "bin" / "nvcc", version)
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    return root


def fake_nvidia_smi(path: Path, banner: str = SMI_H100_BANNER, query: str = SMI_H100_QUERY) -> Path:
    return write_script(
        path,
        'case "$1" in\n'
        f"  --query-gpu=*) {CAT} <<'EOF'\n{query}EOF\n  ;;\n"
        f"  *) {CAT} <<'EOF'\n{banner}EOF\n  ;;\n"
        "esac\n",
    )
