"""`pytorch`: torch's distribution with conda-forge's name, CUDA build string and `__cuda >=major`."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExtforgeError
from .inputs import Artifact, MirrorInputs
from .recipes import PackageJob, exact_self_pin

VERSION_PY = "torch/version.py"
TORCH_CONFIG = "torch/share/cmake/Torch/TorchConfig.cmake"


@dataclass(frozen=True)
class TorchFacts:
    version: str  # 2.14.1+cu130, as torch.__version__ says
    cuda: str | None  # "13.0", None for a CPU build
    cxx11_abi: bool = True  # _GLIBCXX_USE_CXX11_ABI of its libtorch

    @property
    def abi_tag(self) -> str:
        """Hugging Face kernel variants' words for the C++ ABI: cxx11 (new) or cxx98 (old)."""
        return "cxx11" if self.cxx11_abi else "cxx98"


def parse_version_py(text: str, torch_config: str = "") -> TorchFacts:
    """Read torch/version.py (and TorchConfig.cmake for the ABI) as text: the tool never imports torch."""
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if not version:
        raise ValueError("no __version__ in torch/version.py")
    return TorchFacts(version.group(1), cuda.group(1) if cuda else None, parse_cxx11_abi(torch_config))


def parse_cxx11_abi(torch_config: str) -> bool:
    """Old-ABI builds (pip wheels before 2.7) say `-D_GLIBCXX_USE_CXX11_ABI=0` in TORCH_CXX_FLAGS;
    later ones say =1 or, once the old ABI was dropped, nothing."""
    m = re.search(r"_GLIBCXX_USE_CXX11_ABI=(\d)", torch_config)
    return m is None or m.group(1) != "0"


def torch_facts(art: Artifact) -> TorchFacts:
    if art.wheel is not None:
        with zipfile.ZipFile(art.wheel) as zf:
            names = set(zf.namelist())
            config = zf.read(TORCH_CONFIG).decode() if TORCH_CONFIG in names else ""
            return parse_version_py(zf.read(VERSION_PY).decode(), config)
    assert art.installed is not None
    site = Path(art.installed["site_dir"])
    config_file = site / TORCH_CONFIG
    config = config_file.read_text() if config_file.is_file() else ""
    return parse_version_py((site / VERSION_PY).read_text(), config)


def build_string(cuda: str | None, py_short: str) -> str:
    """conda-forge style: `cuda130_py311_h<hash>_0`, or `cpu_py311_h<hash>_0`."""
    variant = f"cuda{cuda.replace('.', '')}" if cuda else "cpu"
    return f"{variant}_py{py_short.replace('.', '')}_h${{{{ hash }}}}_0"


def find_torch(inputs: MirrorInputs) -> Artifact:
    art = inputs.artifacts.get("torch")
    if art is None:
        raise ExtforgeError(
            f"there is no torch in {inputs.description}",
            "the mirror channel exists to build extensions against a torch, and `pytorch` is made "
            "from the torch distribution it is given",
            "install torch into that environment (or put its wheel and its dependency wheels into "
            "the folder), or use --from-pip to let pip fetch torch and its dependencies",
        )
    return art


# conda-forge's pytorch, built against numpy 2, requires what numpy 2's run_exports say.
NUMPY_SPEC = "numpy >=1.23,<3"


def as_pytorch(job: PackageJob, facts: TorchFacts, py_short: str, *, numpy: bool = False) -> PackageJob:
    """torch's package as conda-forge names and pins it; `numpy`: the channel has numpy, which
    conda-forge's pytorch requires (pip's torch does not)."""
    job.build_string = build_string(facts.cuda, py_short)
    # An extension compiled against it calls into libtorch's C++ ABI, which only this exact build
    # has: whatever lists it in its host requirements is pinned to it at run time, as conda-forge's
    # pytorch exports its own pin (there to the minor version).
    job.run_exports.append(exact_self_pin(job.name))
    if numpy:
        job.depends.append(NUMPY_SPEC)
    if facts.cuda:
        # A cuXYZ torch needs a driver of CUDA major X at least: a bare __cuda would let conda put
        # it on an older driver, where it fails only at the first kernel launch.
        job.depends.append(f"__cuda >={facts.cuda.split('.')[0]}")
    job.summary = f"PyTorch {facts.version} (from the torch distribution, repackaged by extforge mirror)"
    job.license = job.license or "BSD-3-Clause"  # its wheel's own metadata first (2.14: six licences, AND-ed)
    return job
