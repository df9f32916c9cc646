import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

nvcc_threads = os.environ.get("NVCC_THREADS", "1")

setup(
    name="demo-ext",
    version="0.1.0",
    packages=["demo_ext"],
    ext_modules=[
        CUDAExtension(
            name="demo_ext._C",
            sources=["demo_ext/csrc/rmsnorm.cpp", "demo_ext/csrc/rmsnorm_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--threads", nvcc_threads]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
