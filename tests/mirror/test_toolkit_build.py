"""A packaged CUDA toolkit compiles a kernel inside a real rattler-build build.

Each toolkit is fetched once into the extforge cache (Debian's 12.4: ~1 GB of .debs, ~2 min
cold; NVIDIA's 13.0 wheels: ~1.2 GB, ~1 min); a warm run packages from the cache and spends
its time in nvcc (~30 s for the probe on 2 cores).
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard

from extforge import mirror, paths
from extforge.audit.elf import open_elf
from extforge.audit.packaging import open_target
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.cuda_rule import Offer
from extforge.errors import ExtforgeError
from extforge.fatbin import arch_sets, parse_fatbin
from extforge.locking import exclusive
from extforge.mirror import cuda_sources, rows
from extforge.mirror.builder import build_job, place
from extforge.mirror.cuda_toolkit import Toolkit, toolkit_jobs
from extforge.mirror.toolchain import compiler_jobs, detect

PROBE = Path(__file__).parent / "data" / "nvcc-probe"
HOST_CUDA = "/usr/local/cuda"
MIRROR_TORCH = "torch==2.14.1"  # the suite's mirror fixture


def toolkit_channel(tk: Toolkit, channel: Path) -> Path:
    """A channel with only the compilers: the toolkit's packages and the gcc activation shims."""
    tc = detect()
    packages = [build_job(job) for job in toolkit_jobs(tk, tc.gxx) + compiler_jobs(tc)]
    place(packages, channel)
    (channel / "variants.yaml").write_text(rows.variants_yaml([rows.Row({
        "c_compiler": "gcc", "c_compiler_version": tc.gcc_major, "cxx_compiler": "gxx",
        "cxx_compiler_version": tc.gcc_major, "cuda_compiler": "cuda-nvcc", "cuda_compiler_version": tk.short,
    })]))
    return channel


def fetched(offer: Offer) -> Toolkit:
    if offer.source == "host":
        return host_toolkit()
    with exclusive(paths.cache_root() / "test-fixtures" / "toolkits.lock"):
        try:
            return cuda_sources.fetch(offer)
        except Exception as exc:  # a cold cache on a machine without Debian or PyPI
            pytest.skip(f"CUDA {offer.version} from {offer.source} cannot be fetched here: {exc}")


def host_toolkit() -> Toolkit:
    """This machine's /usr/local/cuda (as on an offline node), completed with the math headers of
    torch 2.14.1's nvidia wheels when it lacks them (this CI image's toolkit does)."""
    if not Path(HOST_CUDA, "bin", "nvcc").exists():
        pytest.skip(f"no CUDA toolkit in {HOST_CUDA}")
    wheels = mirror.inputs.pip_wheel_dir(mirror.pip_requirements(MIRROR_TORCH, []), f"{sys.version_info[0]}.{sys.version_info[1]}")
    if not (wheels / ".complete").exists():
        pytest.skip(f"torch {MIRROR_TORCH}'s wheels are not in the cache yet (the mirror fixture fetches them)")
    return cuda_sources.add_wheel_headers(cuda_sources.from_host(HOST_CUDA), mirror.from_wheels(wheels))


@pytest.mark.parametrize(("offer", "cudart"), [
    (Offer("12.4", "debian"), "libcudart.so.12"),
    (Offer("13.0", "wheels"), "libcudart.so.13"),
    (Offer("13.0", "host"), "libcudart.so.13"),
], ids=["12.4-debian", "13.0-wheels", "host"])
def test_packaged_nvcc_builds_a_kernel_in_the_build_prefix(offer, cudart, tmp_path):
    tk = fetched(offer)
    channel = toolkit_channel(tk, tmp_path / "channel")
    (pkg,) = build_recipe(BuildOptions.make(PROBE, [channel], tmp_path / "out", variant_configs=[channel / "variants.yaml"],
                                            test=False, audit=False))
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
    # The toolkit's files are in the packages, not links to wherever they came from.
    tools = conda_members(next((tmp_path / "channel" / "linux-64").glob("cuda-nvcc-tools-*.conda")))
    assert tools["bin/nvcc"][0].isfile() and tools["bin/nvcc"][0].size > 1_000_000
    assert b"$(_HERE_)" in tools["bin/nvcc.profile"][1]


def conda_members(path: Path) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    """The files of a .conda package's payload with the contents of the small ones."""
    with zipfile.ZipFile(path) as zf:
        (inner,) = [n for n in zf.namelist() if n.startswith("pkg-")]
        data = zstandard.ZstdDecompressor().stream_reader(zf.open(inner))
        with tarfile.open(fileobj=data, mode="r|") as tar:
            return {m.name: (m, tar.extractfile(m).read() if m.isfile() and m.size < 65536 else b"") for m in tar}


def test_a_build_asking_for_a_toolkit_the_channel_lacks_names_the_fitting_one(tmp_path):
    channel = toolkit_channel(fetched(Offer("12.4", "debian")), tmp_path / "channel")
    with pytest.raises(ExtforgeError) as err:
        build_recipe(BuildOptions.make(PROBE, [channel], tmp_path / "out", variant_configs=[channel / "variants.yaml"],
                                       variants={"cuda_compiler_version": ["12.8"]}, test=False, audit=False))
    assert "no CUDA 12.8 toolkit" in err.value.what and "12.4 would be" in err.value.why
    assert "cuda_compiler_version=12.4" in err.value.fix
