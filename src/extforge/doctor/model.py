"""What `extforge doctor` found: facts about the machine, and findings that say what to fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    severity: str  # one of SEVERITIES
    title: str
    cause: str
    fix: str = ""  # an exact command where there is one

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")


@dataclass(frozen=True)
class PythonFacts:
    executable: str
    version: str  # "3.11.7"
    tag: str  # interpreter tag as in wheel names: "cp311"
    soabi: str | None  # "cpython-311-x86_64-linux-gnu": the suffix of extension modules
    prefix: str


@dataclass(frozen=True)
class TorchFacts:
    version: str  # "2.14.1+cu130"
    cuda: str | None  # torch.version.cuda; None for a CPU build
    cxx11_abi: bool
    lib_dir: str
    arch_list: tuple[str, ...] = ()  # ("sm_80", "sm_90", ...) the archs its kernels carry


@dataclass(frozen=True)
class Nvcc:
    path: str
    found_via: tuple[str, ...]  # "PATH[0]", "CUDA_HOME", "/usr/local/cuda*"
    version: str | None  # "12.8"; None when it did not run
    full_version: str | None = None  # "V12.8.93"
    real_path: str | None = None
    toolkit_root: str | None = None  # the directory to use as CUDA_HOME for this nvcc (has include/cuda_runtime.h)


@dataclass(frozen=True)
class CudaHome:
    """The CUDA_HOME torch.utils.cpp_extension would pick, and why."""

    path: str | None
    reason: str  # "CUDA_HOME", "CUDA_PATH", "nvcc on PATH", "/usr/local/cuda", "none found"
    has_headers: bool = False  # include/cuda_runtime.h exists: torch adds CUDA_HOME/include to every compile

    @property
    def nvcc(self) -> str | None:
        return f"{self.path}/bin/nvcc" if self.path else None


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str  # "9.0"
    driver_version: str | None = None

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")


@dataclass(frozen=True)
class DriverFacts:
    driver_version: str | None  # "580.65.06"
    max_cuda: str | None  # the highest CUDA the driver supports: "13.0"
    gpus: tuple[Gpu, ...] = ()
    source: str = ""  # "nvidia-smi", "/proc/driver/nvidia/version", or why there is none


@dataclass(frozen=True)
class CompilerFacts:
    command: str  # what torch would run: $CXX or c++
    path: str | None
    version_line: str | None  # first line of `--version`
    default_cxx11_abi: bool | None
    # The libstdc++.so it links by default; None: it would link libstdc++.a into every extension.
    shared_libstdcxx: str | None = None


@dataclass(frozen=True)
class CompileCacheFacts:
    """The compile cache `extforge build` would use, and whose objects it can hold."""

    tool: str | None  # "ccache" or "sccache"; None: neither is on PATH
    path: str | None  # the folder this user's compiles use
    use: str  # "private", "per-user", "refused" (builds compile without it) or "none"
    why: str = ""  # why per-user, why refused, or why none
    fix: str = ""  # for "refused"


@dataclass(frozen=True)
class ExtensionFacts:
    """An installed extension of those data/doctor-extensions.yaml names."""

    name: str
    module: str  # its compiled extension module
    version: str
    location: str
    installer: str  # "conda", "pip", ...
    conda_build: str | None = None  # build string of the conda package
    conda_channel: str | None = None
    wheel_tags: tuple[str, ...] = ()  # Tag: lines of the dist-info WHEEL file
    extension: str | None = None  # path of the module's .so, None when absent
    audit_verdict: str | None = None
    audit_problems: tuple[str, ...] = ()


@dataclass
class Facts:
    python: PythonFacts | None = None
    torch: TorchFacts | None = None
    nvccs: list[Nvcc] = field(default_factory=list)
    cuda_home: CudaHome | None = None
    driver: DriverFacts | None = None
    compiler: CompilerFacts | None = None
    glibc: str | None = None
    cores: int | None = None
    memory_bytes: int | None = None
    memory_source: str | None = None
    plan: dict[str, Any] | None = None  # MAX_JOBS / NVCC_THREADS the planner would use
    compile_cache: CompileCacheFacts | None = None
    extensions: list[ExtensionFacts] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)  # what could not be checked, and why


@dataclass
class DoctorReport:
    facts: Facts
    findings: list[Finding]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"facts": asdict(self.facts), "findings": [asdict(f) for f in self.findings]}
