"""Package test: flash-attn is a compiled, CPython-specific package, never py3-none-any."""

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

dist = importlib.metadata.distribution("flash_attn")
wheel = dist.read_text("WHEEL") or ""
tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
assert tags, f"no Tag in WHEEL: {wheel!r}"
assert all(not t.endswith("-none-any") for t in tags), f"pure-Python wheel tag {tags}"
assert "Root-Is-Purelib: false" in wheel, wheel

spec = importlib.util.find_spec("flash_attn_2_cuda")
assert spec is not None and spec.origin and spec.origin.endswith(".so"), spec
assert Path(spec.origin).stat().st_size > 1_000_000, f"{spec.origin} is suspiciously small"

info = json.loads((Path(sys.prefix) / "share/extforge/build/flash-attn.json").read_text())
# The package's imports: the recipe's only import test (one test env, torch imported once).
import flash_attn  # noqa: E402, F401
import flash_attn_2_cuda  # noqa: E402, F401
import torch  # noqa: E402  (after the cheap checks)

assert info["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI), info
assert str(info.get("cxx_std", "")).startswith(("c++", "gnu++")), f"no C++ standard recorded: {info}"
assert info["torch"] == torch.__version__, (info["torch"], torch.__version__)
print("flash-attn package checks passed:", tags, spec.origin)
