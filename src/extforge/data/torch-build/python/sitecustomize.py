"""extforge-torch-build: no Python process of a build reaches the network. Loaded by every
interpreter the build starts (PYTHONPATH); an audit hook refuses resolving or connecting to any
address that is not this machine, and records the attempt for the end-of-build check.

The refusal is a BaseException on purpose: upstream setup.py files catch urllib's errors and
fall back, or worse, retry; this one ends the process with a message that names the address."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import traceback
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

LOCAL_NAMES = {"localhost", "", "::1", "0.0.0.0"}
STDLIB = sysconfig.get_paths()["stdlib"]
REFUSING_PROXY = "http://127.0.0.1:9"  # activate.sh's


class NetworkRefused(BaseException):
    pass


def _local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    return host is None or not isinstance(host, str) or host in LOCAL_NAMES or host.startswith("127.")


def _hook(event: str, args: tuple) -> None:
    if event == "urllib.Request":
        host = urllib.parse.urlsplit(args[0]).hostname
    elif event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6):
        host = args[1][0]
    else:
        return
    if _local(host):
        return
    # The innermost caller outside the standard library: upstream's setup.py, usually.
    frame = next((f for f in reversed(traceback.extract_stack()[:-1])
                  if not f.filename.startswith(STDLIB) and f.filename != __file__), None)
    # Relative to the build's source folder where it is there: `setup.py:330`.
    name = os.path.relpath(frame.filename) if frame and frame.filename.startswith(os.getcwd() + os.sep) else None
    where = f" from {name or frame.filename}:{frame.lineno}" if frame else ""
    line = f"{host}{where} (python {' '.join(sys.argv[:3])})"
    log = os.environ.get("EXTFORGE_NETWORK_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(line + "\n")
    raise NetworkRefused(f"extforge-torch-build: network access during a build is refused: {line}")


# The layer points non-Python downloaders at a refusing proxy; in Python the hook is the guard, and
# a request sent to that (local) proxy would never name the host it was for.
for _name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
    if os.environ.get(_name) == REFUSING_PROXY:
        del os.environ[_name]
sys.addaudithook(_hook)


class _CppExtensionHook:
    """Applies extforge_build_ext to torch.utils.cpp_extension as a build imports it (every
    extension of a setup.py in one ninja run); any other import passes by."""

    target = "torch.utils.cpp_extension"

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.target:
            return None
        import importlib.machinery

        import extforge_build_ext

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            extforge_build_ext.after_import(spec.loader, extforge_build_ext.patch)
        return spec


if os.environ.get("EXTFORGE_LAYER") == "active":
    sys.meta_path.insert(0, _CppExtensionHook())
