"""Which toolkit a torch gets, and how a toolkit's files are laid out and split into packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from extforge.cuda_rule import Offer, choose, missing_toolkit
from extforge.errors import ExtforgeError
from extforge.mirror import cuda_sources
from extforge.mirror.cuda_toolkit import Toolkit, cudart_links, nvcc_profile, package_of, toolkit_jobs

OFFERS = [Offer("12.4", "debian"), Offer("11.8", "debian")] + [Offer(f"13.{m}", "wheels") for m in range(6)]


@pytest.mark.parametrize(
    ("torch_cuda", "picked"),
    [
        ("12.4", "12.4"),  # cluster C: the exact minor
        ("12.8", "12.4"),  # clusters A, B: the highest lower minor of the same major
        ("13.0", "13.0"),  # cluster D, CI
        ("13.2", "13.2"),
        ("11.8", "11.8"),
    ],
)
def test_the_rule_same_major_exact_minor_else_the_highest_lower_one(torch_cuda, picked):
    assert choose(torch_cuda, OFFERS).version == picked


def test_the_highest_fitting_minor_wins_whatever_its_source():
    offers = [Offer("12.4", "debian"), Offer("12.6", "host")]
    assert choose("12.8", offers) == Offer("12.6", "host")
    assert choose("12.4", offers + [Offer("12.4", "host")]).source == "debian"


def test_no_toolkit_of_torchs_major_names_what_would_fit_and_how_to_add_one():
    with pytest.raises(ExtforgeError) as err:
        choose("12.1", [Offer("12.4", "debian"), Offer("13.0", "wheels")])
    e = err.value
    assert "CUDA 12.1" in e.what
    assert "12.0 ... 12.1" in e.why and "12.4 (debian)" in e.why and "newer minor" in e.why
    assert "--cuda-home" in e.fix and "cuda_sources" in e.fix
    with pytest.raises(ExtforgeError, match="no CUDA toolkit for torch built with CUDA 14.0"):
        choose("14.0", OFFERS)


def test_a_host_toolkit_that_does_not_fit_is_refused(tmp_path, monkeypatch):
    host = Toolkit("13.0.88", "host", "the CUDA 13.0.88 toolkit in /x", {}, "id")
    monkeypatch.setattr(cuda_sources, "from_host", lambda home: host)
    with pytest.raises(ExtforgeError) as err:
        cuda_sources.toolkit_for("12.8", "/x")
    assert "13.0 (host)" in err.value.why
    assert cuda_sources.toolkit_for("13.0", "/x") is host


@pytest.mark.parametrize(
    ("member", "rel"),
    [
        ("./usr/lib/nvidia-cuda-toolkit/bin/nvcc", "bin/nvcc"),
        ("./usr/bin/nvcc", None),  # Debian's wrapper script
        ("./usr/bin/ptxas", "bin/ptxas"),
        ("./usr/lib/nvidia-cuda-toolkit/bin/cicc", "nvvm/bin/cicc"),
        ("./usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub", "bin/crt/link.stub"),
        ("./usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc", "nvvm/libdevice/libdevice.10.bc"),
        ("./usr/include/cublas_v2.h", "targets/x86_64-linux/include/cublas_v2.h"),
        ("./usr/include/thrust/version.h", "targets/x86_64-linux/include/thrust/version.h"),
        ("./usr/lib/x86_64-linux-gnu/libcudart.so.12", "targets/x86_64-linux/lib/libcudart.so.12"),
        ("./usr/lib/x86_64-linux-gnu/libcublas.so.12", None),
        ("./usr/lib/x86_64-linux-gnu/libcudadevrt.a", "targets/x86_64-linux/lib/libcudadevrt.a"),
        ("./usr/lib/x86_64-linux-gnu/libcublas_static.a", None),
    ],
)
def test_debian_files_land_where_an_nvidia_toolkit_keeps_them(member, rel):
    assert cuda_sources.debian_target(member) == rel


@pytest.mark.parametrize(
    ("member", "rel"),
    [
        ("nvidia/cu13/bin/nvcc", "bin/nvcc"),
        ("nvidia/cu13/bin/nvcc.profile", None),  # ours replaces it
        ("nvidia/cu13/nvvm/bin/cicc", "nvvm/bin/cicc"),
        ("nvidia/cu13/include/cccl/cub/cub.cuh", "targets/x86_64-linux/include/cccl/cub/cub.cuh"),
        ("nvidia/cu13/lib/libcudart.so.13", "targets/x86_64-linux/lib/libcudart.so.13"),
        ("nvidia/cu13/lib/libcublas.so.13", None),
        ("nvidia_cuda_nvcc-13.0.88.dist-info/RECORD", None),
    ],
)
def test_wheel_files_land_where_an_nvidia_toolkit_keeps_them(member, rel):
    assert cuda_sources.wheel_target(member) == rel


@pytest.mark.parametrize(
    ("rel", "package"),
    [
        ("bin/nvcc", "cuda-nvcc-tools"),
        ("nvvm/bin/cicc", "cuda-nvcc-tools"),
        ("targets/x86_64-linux/include/cuda_runtime.h", "cuda-cudart-dev"),
        ("targets/x86_64-linux/include/crt/host_config.h", "cuda-cudart-dev"),
        ("targets/x86_64-linux/include/cublas_v2.h", "cuda-libraries-dev"),
        ("targets/x86_64-linux/include/cusparse.h", "cuda-libraries-dev"),
        ("targets/x86_64-linux/include/cub/cub.cuh", "cuda-cccl"),
        ("targets/x86_64-linux/include/cccl/thrust/version.h", "cuda-cccl"),
        ("targets/x86_64-linux/lib/libcudart.so.12", "cuda-cudart-dev"),
        ("share/doc/x", None),
    ],
)
def test_each_file_belongs_to_one_package(rel, package):
    assert package_of(rel) == package


def test_the_profile_is_relative_to_nvcc_itself():
    profile = nvcc_profile(has_cccl_dir=True)
    assert "TOP = $(_HERE_)/.." in profile and "/usr" not in profile
    assert "include/cccl" in profile and "include/cccl" not in nvcc_profile(has_cccl_dir=False)


def test_package_set_pins_its_cuda_version_and_exports_it(tmp_path: Path):
    files = {
        "bin/nvcc": tmp_path / "nvcc",
        "targets/x86_64-linux/lib/libcudart.so.13": tmp_path / "libcudart.so.13",
        "targets/x86_64-linux/include/cccl/cub/cub.cuh": tmp_path / "cub.cuh",
    }
    for f in files.values():
        f.write_text("x")
    tk = Toolkit("13.0.88", "wheels", "NVIDIA's wheels", files, "id")
    jobs = {j.name: j for j in toolkit_jobs(tk, "/usr/bin/g++")}
    assert set(jobs) == {"cuda-version", "cuda-nvcc-tools", "cuda-cudart-dev", "cuda-cccl", "cuda-libraries-dev",
                         "cuda-nvcc_linux-64", "cuda-nvcc"}
    assert jobs["cuda-version"].version == "13.0" and jobs["cuda-version"].constrains == ["__cuda >=13"]
    assert jobs["cuda-nvcc_linux-64"].strong_run_exports == ["cuda-version >=13.0,<14.0a0"]
    assert "cuda-nvcc-tools ==13.0.88" in jobs["cuda-nvcc_linux-64"].depends
    (_, body, _), = jobs["cuda-nvcc_linux-64"].manifest["texts"]
    assert 'CUDA_HOME="$_ef_prefix"' in body and "include/cccl" in body and "/usr/local/cuda" not in body
    assert ["bin/nvcc", str(files["bin/nvcc"])] == jobs["cuda-nvcc-tools"].manifest["files"][0][1::-1]
    assert jobs["cuda-version"].build_string == "h${{ hash }}_0"
    assert jobs["cuda-nvcc"].build_string.startswith("wheels_")
    # Only the versioned runtime in the wheel: -lcudart needs the plain name, and torch looks in lib/.
    assert cudart_links(tk) == [["targets/x86_64-linux/lib/libcudart.so", "libcudart.so.13"],
                                ["lib/libcudart.so", "../targets/x86_64-linux/lib/libcudart.so"]]


def test_a_build_without_a_fitting_toolkit_in_the_channel_says_which_would_fit():
    specs = ["gcc_linux-64 12.*", "cuda-nvcc_linux-64 12.8.*"]
    err = missing_toolkit(specs, {"12.4.131", "13.0.88"})
    assert err is not None and "CUDA 12.8 toolkit" in err.what
    assert "12.4, 13.0" in err.why and "12.4 would be" in err.why
    assert "--variant cuda_compiler_version=12.4" in err.fix and "--cuda-home" in err.fix
    none = missing_toolkit(["cuda-nvcc_linux-64 11.8.*"], {"13.0.88"})
    assert none is not None and "none is there" in none.why and "--variant" not in none.fix
    # the toolkit is there: the failure is about something else
    assert missing_toolkit(specs, {"12.8.93"}) is None
    assert missing_toolkit(["python 3.11.*"], set()) is None
