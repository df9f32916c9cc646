"""What a node offers a CUDA environment: GPUs (compute capability), the driver's CUDA
version, glibc.

NVML (libnvidia-ml.so.1 through ctypes) is asked first: nvidia-smi is built on it, and it
answers in milliseconds without a process start. When it is absent or fails, the doctor's
nvidia-smi probe (pure parsers of the real output, tested there) answers instead.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass, field

from ..doctor.driver import probe_driver
from ..doctor.model import DriverFacts, Gpu
from ..machine import detect

NVML_LIB = "libnvidia-ml.so.1"


@dataclass
class NodeFacts:
    driver: DriverFacts = field(default_factory=lambda: DriverFacts(None, None, (), source="not probed"))
    glibc: str | None = None

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self.driver.gpus

    def to_json(self) -> dict:
        return {"driver": asdict(self.driver), "glibc": self.glibc}


def cuda_version_from_int(value: int) -> str:
    """NVML / cudaDriverGetVersion encoding: 1000 * major + 10 * minor (13000 → "13.0")."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def probe_nvml(lib: str = NVML_LIB) -> DriverFacts | None:
    """Driver facts from NVML, or None when the library is missing or does not initialise."""
    try:
        nvml = ctypes.CDLL(lib)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        version = ctypes.c_int()
        cuda = None
        if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(version)) == 0:
            cuda = cuda_version_from_int(version.value)
        buf = ctypes.create_string_buffer(96)
        driver = buf.value.decode() if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0 else None
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        gpus = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            major, minor = ctypes.c_int(), ctypes.c_int()
            nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            nvml.nvmlDeviceGetName(handle, buf, 96)
            gpus.append(Gpu(buf.value.decode(), f"{major.value}.{minor.value}", driver))
        return DriverFacts(driver, cuda, tuple(gpus), source=f"NVML ({lib})")
    finally:
        nvml.nvmlShutdown()


def probe() -> NodeFacts:

    return NodeFacts(driver=probe_nvml() or probe_driver(os.environ), glibc=detect().glibc)
