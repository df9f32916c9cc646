import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

nvcc_threads = os.environ.get("NVCC_THREADS", "1")
# As many upstream setup.py files do (causal-conv1d, mamba-ssm): a hard-coded arch list, which makes
# torch drop TORCH_CUDA_ARCH_LIST. The build layer replaces it with the variant's archs; the tests
# check that the package carries exactly those.
UPSTREAM_ARCHS = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_90,code=sm_90"]

setup(
    name="demo-ext",
    version="0.1.0",
    packages=["demo_ext"],
    ext_modules=[
        CUDAExtension(
            name="demo_ext._C",
            sources=["demo_ext/csrc/rmsnorm.cpp", "demo_ext/csrc/rmsnorm_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--threads", nvcc_threads, *UPSTREAM_ARCHS]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
