from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="wrong-abi-ext",
    version="0.1.0",
    ext_modules=[CppExtension(name="wrong_abi_ext", sources=["wrong_abi.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
