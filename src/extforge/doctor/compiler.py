"""The host C++ compiler torch would call, and the std::string ABI it uses by default."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

from .model import CompilerFacts
from .run import run_text

_ABI = re.compile(r"^#define _GLIBCXX_USE_CXX11_ABI (\d)", re.M)


def parse_abi_macros(text: str) -> bool | None:
    """`c++ -x c++ -dM -E -` of `#include <string>` → the default _GLIBCXX_USE_CXX11_ABI.

    None when libstdc++ does not define it (libc++, very old GCC).
    """
    m = _ABI.search(text)
    return m.group(1) == "1" if m else None


def parse_print_file_name(text: str) -> str | None:
    """`g++ -print-file-name=libstdc++.so` → the library's path, None when g++ has none (it
    then echoes the bare name back and links libstdc++.a instead)."""
    found = text.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def probe_compiler(env: Mapping[str, str]) -> CompilerFacts:
    # torch.utils.cpp_extension runs $CXX, else `c++`.
    command = env.get("CXX") or "c++"
    path = shutil.which(command.split()[0], path=env.get("PATH", ""))
    if not path:
        return CompilerFacts(command, None, None, None)
    version = run_text([path, "--version"], env=env)
    macros = run_text([path, "-x", "c++", "-dM", "-E", "-"], stdin="#include <string>\n", env=env)
    libstdcxx = run_text([path, "-print-file-name=libstdc++.so"], env=env)
    return CompilerFacts(
        command=command,
        path=path,
        version_line=version.stdout.splitlines()[0] if version and version.stdout else None,
        default_cxx11_abi=parse_abi_macros(macros.stdout) if macros and macros.returncode == 0 else None,
        shared_libstdcxx=parse_print_file_name(libstdcxx.stdout) if libstdcxx else None,
    )
