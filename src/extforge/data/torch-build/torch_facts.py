"""What a torch extension build needs to know about the host env's torch, from one import:
prints `ABI VERSION CUDA STD` (e.g. `1 2.14.1+cu130 13.0 c++20`). Runs under the host python
(3.10 and newer) inside a build; standard library and torch only.

The ABI is torch._C._GLIBCXX_USE_CXX11_ABI, checked against what torch.utils.cpp_extension
itself passes to compilers (older torch adds -D_GLIBCXX_USE_CXX11_ABI=<n>, newer torch relies on
the compiler's default): the two disagreeing is a broken torch, refused before any compile.
"""

from __future__ import annotations

import sys

from torch_cxx_std import probed, required_by_guards, torch_include


def main(argv: list[str]) -> int:
    import torch
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags: list[str] = []
    add = getattr(cpp_extension, "_add_gnu_cpp_abi_flag", None)
    if add is not None:
        add(flags)
    passed = next((f.split("=", 1)[1] for f in flags if f.startswith("-D_GLIBCXX_USE_CXX11_ABI=")), "")
    if passed and passed != str(abi):
        print(f"error: torch.utils.cpp_extension passes _GLIBCXX_USE_CXX11_ABI={passed} but "
              f"torch._C._GLIBCXX_USE_CXX11_ABI is {abi}: this torch is inconsistent", file=sys.stderr)
        return 1
    include = torch_include()
    std = required_by_guards(include) or probed(include, argv[1] if len(argv) > 1 else "c++")
    print(abi, torch.__version__, torch.version.cuda, std)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
