"""The rule that matches a CUDA toolkit to a torch build (docs/architecture.md, "CUDA toolkits").

Pure logic, shared by the mirror (which packages the toolkit it chooses) and the build (which
explains a solve that found no toolkit of the version a recipe asked for).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ExtforgeError

NVCC_SPEC = re.compile(r"^cuda-nvcc_linux-64\s+(\d+)\.(\d+)")

def version_key(version: str) -> tuple[int, int]:
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int(minor)

@dataclass(frozen=True)
class Offer:
    """A toolkit version one source can provide (`13.0` from NVIDIA's wheels, `12.4` from Debian)."""

    version: str  # major.minor
    source: str  # wheels | debian | host

    @property
    def key(self) -> tuple[int, int]:
        return version_key(self.version)

def takes(torch_cuda: str, toolkit: str) -> bool:
    """Whether a torch built with CUDA `torch_cuda` takes a toolkit (both major.minor): same major
    (torch's cpp_extension refuses another), minor at most torch's (torch only warns about a
    lower one, and code built with an older minor runs on the newer runtime)."""
    want, have = version_key(torch_cuda), version_key(toolkit)
    return have[0] == want[0] and have[1] <= want[1]


def choose(torch_cuda: str, offers: list[Offer]) -> Offer:
    """The toolkit for a torch built with CUDA `torch_cuda`, by the rule in docs/architecture.md
    (`takes`): the exact minor first, else the highest lower one."""
    want = version_key(torch_cuda)
    fitting = [o for o in offers if takes(torch_cuda, o.version)]
    if fitting:
        return max(fitting, key=lambda o: (o.key, o.source != "host"))
    same_major = sorted({o.version for o in offers if o.key[0] == want[0]}, key=version_key)
    available = ", ".join(f"{o.version} ({o.source})" for o in sorted(offers, key=lambda o: o.key)) or "none"
    raise ExtforgeError(
        f"no CUDA toolkit for torch built with CUDA {torch_cuda}",
        f"torch refuses an nvcc of another major version and a newer minor than its own; fitting is "
        f"{want[0]}.0 ... {torch_cuda}, available here: {available}"
        + (f" ({', '.join(same_major)} have a newer minor)" if same_major else ""),
        f"give `extforge mirror` a toolkit {want[0]}.x with x <= {want[1]}: --cuda-home DIR for a toolkit "
        f"installed on this machine (e.g. /usr/local/cuda-{torch_cuda}), or add a source for CUDA {want[0]}.x "
        "to extforge.mirror.cuda_sources (NVIDIA's nvidia-cuda-nvcc wheels carry complete compilers from 13.0 on; "
        "Debian's non-free nvidia-cuda-toolkit for 12.x and 11.x)",
    )

def fitting_toolkits(major: int, minor: int, toolkits: set[str]) -> list[str]:
    """The toolkits (major.minor) that compile for a torch of CUDA major.minor: same major, minor at
    most the asked one, oldest first."""
    shorts = {".".join(v.split(".")[:2]) for v in toolkits}
    return sorted((s for s in shorts if takes(f"{major}.{minor}", s)), key=version_key)


def missing_toolkit(specs: list[str], channel_toolkits: set[str]) -> ExtforgeError | None:
    """A build solve that failed on `${{ compiler('cuda') }}` because the channels hold no
    toolkit of that version: what would fit (same major, minor at most the asked one) and how to
    add one. None when the failure is not about the toolkit."""
    asked = next((m for s in specs if (m := NVCC_SPEC.match(s))), None)
    if asked is None:
        return None
    major, minor = int(asked.group(1)), int(asked.group(2))
    shorts = {".".join(v.split(".")[:2]) for v in channel_toolkits}
    if f"{major}.{minor}" in shorts:
        return None
    fitting = fitting_toolkits(major, minor, channel_toolkits)
    have = ", ".join(sorted(shorts, key=version_key)) or "none"
    return ExtforgeError(
        f"the channels have no CUDA {major}.{minor} toolkit (cuda-nvcc_linux-64 {major}.{minor}.*)",
        f"their CUDA toolkits: {have}; a torch built with CUDA {major}.{minor} needs a toolkit of major {major} and "
        f"minor <= {minor}" + (f", which {', '.join(fitting)} would be" if fitting else ", and none is there"),
        (f"build with --variant cuda_compiler_version={fitting[-1]}, or " if fitting else "")
        + "run `extforge mirror` into the channel for that torch: it packages a fitting toolkit (NVIDIA's wheels for "
        "13.x, Debian's nvidia-cuda-toolkit 12.4 for 12.x, or --cuda-home DIR for one installed on this machine)",
    )
