"""A packaged CUDA toolkit compiles a kernel inside a real rattler-build build.

Each toolkit is fetched once into the extforge cache (Debian's 12.4: ~1 GB of .debs, ~2 min
cold; NVIDIA's 13.0 wheels: ~1.2 GB, ~1 min); a warm run packages from the cache and spends
its time in nvcc (~30 s for the probe on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from extforge import paths
from extforge.audit.elf import open_elf
from extforge.audit.fatbin import arch_sets, parse_fatbin
from extforge.audit.packaging import open_target
from extforge.build import build_recipe
from extforge.locking import exclusive
from extforge.mirror import cuda_sources, variants_yaml
from extforge.mirror.channel import build_job, place
from extforge.mirror.cuda_toolkit import Offer, Toolkit, toolkit_jobs
from extforge.mirror.toolchain import compiler_jobs, detect

PROBE = Path(__file__).parent / "data" / "nvcc-probe"


def toolkit_channel(tk: Toolkit, channel: Path) -> Path:
    """A channel with only the compilers: the toolkit's packages and the gcc activation shims."""
    tc = detect()
    packages = [build_job(job) for job in toolkit_jobs(tk, tc.gxx) + compiler_jobs(tc)]
    place(packages, channel)
    (channel / "variants.yaml").write_text(variants_yaml({
        "c_compiler": "gcc", "c_compiler_version": tc.gcc_major, "cxx_compiler": "gxx",
        "cxx_compiler_version": tc.gcc_major, "cuda_compiler": "cuda-nvcc", "cuda_compiler_version": tk.short,
    }))
    return channel


def fetched(offer: Offer) -> Toolkit:
    with exclusive(paths.cache_root() / "test-fixtures" / "toolkits.lock"):
        try:
            return cuda_sources.fetch(offer)
        except Exception as exc:  # a cold cache on a machine without Debian or PyPI
            pytest.skip(f"CUDA {offer.version} from {offer.source} cannot be fetched here: {exc}")


@pytest.mark.parametrize(("offer", "cudart"), [
    (Offer("12.4", "debian"), "libcudart.so.12"),
    (Offer("13.0", "wheels"), "libcudart.so.13"),
], ids=["12.4-debian", "13.0-wheels"])
def test_packaged_nvcc_builds_a_kernel_in_the_build_prefix(offer, cudart, tmp_path):
    tk = fetched(offer)
    channel = toolkit_channel(tk, tmp_path / "channel")
    (pkg,) = build_recipe(PROBE, [channel], tmp_path / "out", variant_config=[channel / "variants.yaml"],
                          test=False, audit=False)
    with open_target(pkg.path) as payload:
        # The strong run export of cuda-nvcc_linux-64: what nvcc X.Y built needs CUDA X.>=Y.
        major = tk.major
        assert f"cuda-version >={tk.short},<{major + 1}.0a0" in payload.depends
        (so,) = payload.elf_files
        obj = open_elf(so)
        assert cudart in obj.needed
        sec = obj.sections[".nv_fatbin"]
        sass, _ = arch_sets(parse_fatbin(obj._map, sec.offset, sec.offset + sec.size))
        obj.close()
    assert sass == ["sm_90"]
    # The toolkit's files are in the packages, not on this host: nothing references /usr/local/cuda.
    nvcc_tools = next((tmp_path / "channel" / "linux-64").glob("cuda-nvcc-tools-*.conda"))
    assert nvcc_tools.stat().st_size > 10_000_000
