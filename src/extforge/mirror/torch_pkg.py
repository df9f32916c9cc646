"""`pytorch`: torch's distribution with conda-forge's name, CUDA build string and `__cuda >=major`."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExtforgeError
from .inputs import Artifact, MirrorInputs
from .recipes import PackageJob


@dataclass(frozen=True)
class TorchFacts:
    version: str  # 2.14.1+cu130, as torch.__version__ says
    cuda: str | None  # "13.0", None for a CPU build


def parse_version_py(text: str) -> TorchFacts:
    """Read torch/version.py as text: the tool never imports torch."""
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if not version:
        raise ValueError("no __version__ in torch/version.py")
    return TorchFacts(version.group(1), cuda.group(1) if cuda else None)


def torch_facts(art: Artifact) -> TorchFacts:
    if art.wheel is not None:
        with zipfile.ZipFile(art.wheel) as zf:
            return parse_version_py(zf.read("torch/version.py").decode())
    assert art.installed is not None
    return parse_version_py((Path(art.installed["site_dir"]) / "torch" / "version.py").read_text())


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


def as_pytorch(job: PackageJob, facts: TorchFacts, py_short: str) -> PackageJob:
    job.build_string = build_string(facts.cuda, py_short)
    if facts.cuda:
        # A cuXYZ torch needs a driver of CUDA major X at least: a bare __cuda would let conda put
        # it on an older driver, where it fails only at the first kernel launch.
        job.depends.append(f"__cuda >={facts.cuda.split('.')[0]}")
    job.summary = f"PyTorch {facts.version} (from the torch distribution, repackaged by extforge mirror)"
    job.license = "BSD-3-Clause"
    return job
