"""Package test: flash_attn_3 is one abi3 module built for this package's torch and subset."""

import importlib.util
import json
import sys
from pathlib import Path

spec = importlib.util.find_spec("flash_attn_3._C")
assert spec is not None and spec.origin and spec.origin.endswith("_C.abi3.so"), spec
assert Path(spec.origin).stat().st_size > 1_000_000, f"{spec.origin} is suspiciously small"

info = json.loads((Path(sys.prefix) / "share/extforge/build/flash-attn-3.json").read_text())
import torch  # noqa: E402  (after the cheap checks)

assert info["torch"] == torch.__version__, (info["torch"], torch.__version__)
import flash_attn_config  # noqa: E402  (upstream's record of its DISABLE switches)

flags = flash_attn_config.CONFIG["build_flags"]
disabled = {k.split("DISABLE_", 1)[1].replace("SM8x", "SM80") for k, v in flags.items() if v and "DISABLE_" in k}
recorded = {s.split("DISABLE_", 1)[1] for s in info["subset"]["disabled"]}
assert disabled == recorded, (disabled, recorded)
print("flash-attn-3 package checks passed:", spec.origin, info["subset"])
