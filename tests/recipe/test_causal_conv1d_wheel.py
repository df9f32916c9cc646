"""causal-conv1d's real package (the build of test_causal_conv1d_build.py) becomes a wheel a pip
venv can take: tagged as auditwheel reads its binary, pinned to its torch, its module pointed at
torch's and CUDA's folders as pip's torch lays them out, passing the audit against that torch. The
old code makes the same wheel: no test before showed it for a build-layer package other than
demo-ext, whose module sits in its package folder; causal-conv1d's sits at the top of
site-packages, so its search path is `$ORIGIN/torch/lib`, not `$ORIGIN/../torch/lib`."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from extforge.archive import check_package
from extforge.audit import audit_target
from extforge.audit.channel_target import pinned_torch_prefix
from extforge.audit.elf import open_elf
from extforge.wheel.make import wheel_from_conda

MODULE = "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so"
STEM = "causal_conv1d-1.7.0+cu130torch2.14cxx11abiTRUE"


@pytest.mark.slow
def test_causal_conv1ds_package_becomes_a_wheel_tagged_pinned_and_relinked_for_a_pip_venv(
        causal_conv1d_build: Path, mirror_channel: Path, tmp_path: Path) -> None:
    (package,) = sorted((causal_conv1d_build / "channel" / "linux-64").glob("causal-conv1d-*.conda"))
    torch = pinned_torch_prefix([str(d) for d in check_package(package).index["depends"]], [str(mirror_channel)])
    wheel = wheel_from_conda(package, tmp_path / "wheels", torch)
    assert wheel.path.name.startswith(f"{STEM}-cp311-cp311-manylinux_2_") and wheel.torch.row == "torch2.14.1-cu130"

    # The platform tag is auditwheel's reading of the symbols, torch's and CUDA's libraries found
    # where pip's torch keeps them.
    site = torch / "lib" / "python3.11" / "site-packages"
    libs = [site / "torch" / "lib", site / "nvidia" / "cu13" / "lib"]
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", "--ldpaths", ":".join(map(str, libs)),
                          str(wheel.path)], capture_output=True, text=True, check=True)
    verdict = json.loads(out.stdout)
    assert verdict["sym_tag"] == wheel.tag.rsplit("-", 1)[1]
    assert {"libc10.so", "libtorch_cpu.so", "libcudart.so.13"} <= set(verdict["external_libs"])

    with zipfile.ZipFile(wheel.path) as zf:
        metadata = zf.read(f"{STEM}.dist-info/METADATA").decode().splitlines()
        (tmp_path / MODULE).write_bytes(zf.read(MODULE))
    assert [line for line in metadata if line.startswith("Requires")] == [
        "Requires-Python: ==3.11.*", "Requires-Dist: torch==2.14.1", "Requires-Dist: packaging"]
    obj = open_elf(tmp_path / MODULE)
    assert (obj.rpath, obj.runpath) == (["$ORIGIN/torch/lib", "$ORIGIN/nvidia/cu13/lib"], [])
    obj.close()

    report = audit_target(wheel.path, against=torch)
    assert report.ok, [f.message for f in report.findings if f.severity == "error"]
    assert wheel_from_conda(package, tmp_path / "again", torch).sha256 == wheel.sha256
