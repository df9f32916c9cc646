"""At the end of a successful build (in-build.sh): the build record
$PREFIX/share/extforge/build/$PKG_NAME.json, which `extforge audit` reads for the archs the
package promises (and the units compiled as parallel parts), and ninja's log beside it (the
per-unit times the planner learns from). A recipe's own facts (EXTFORGE_RECORD_EXTRA: a JSON
object its steps wrote, e.g. the kernel subset it built) join the record; the layer's keys win.
Also says, once, what extforge-nvcc replaced in upstream's compile lines."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    env = os.environ
    out = Path(env["PREFIX"], "share", "extforge", "build")
    out.mkdir(parents=True, exist_ok=True)
    rewrites_file = Path(env.get("EXTFORGE_REWRITES_LOG", "/nonexistent"))
    rewrites = rewrites_file.read_text().splitlines() if rewrites_file.is_file() else []
    logs = sorted(Path(env["SRC_DIR"]).rglob(".ninja_log"))
    if logs:
        shutil.copyfile(logs[0], out / f"{env['PKG_NAME']}.ninja_log")
    split_file = Path(env.get("EXTFORGE_SPLIT_LOG", "/nonexistent"))
    split = [d for line in split_file.read_text().splitlines() if "parts" in (d := json.loads(line))] \
        if split_file.is_file() else []
    record = {
        "schema": 1,
        "name": env["PKG_NAME"],
        "version": env.get("PKG_VERSION"),
        "layer": "extforge-torch-build",
        "cxx11_abi": env.get("EXTFORGE_TORCH_ABI") == "1",
        "cxx_std": env.get("EXTFORGE_CXX_STD"),
        "torch": env.get("EXTFORGE_TORCH_VERSION"),
        "torch_cuda": None if env.get("EXTFORGE_TORCH_CUDA") in (None, "None") else env.get("EXTFORGE_TORCH_CUDA"),
        "torch_cuda_arch_list": env.get("TORCH_CUDA_ARCH_LIST"),
        "cuda_archs": env.get("EXTFORGE_ARCH_NAMES", "").split(","),
        "max_jobs": int(env.get("MAX_JOBS", "1")),
        "nvcc_threads": int(env.get("NVCC_THREADS", "1")),
        "network": env.get("EXTFORGE_NETWORK"),
        "upstream_flags_replaced": rewrites,
        "ninja_log": bool(logs),
        "split_units": split,
    }
    extra_file = Path(env.get("EXTFORGE_RECORD_EXTRA", "/nonexistent"))
    if extra_file.is_file():
        extra = json.loads(extra_file.read_text())
        if not isinstance(extra, dict):
            print(f"error: extforge-torch-build: {extra_file} (EXTFORGE_RECORD_EXTRA) holds no JSON object", file=sys.stderr)
            return 1
        record = {**extra, **record}
    (out / f"{env['PKG_NAME']}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if rewrites:
        print(f"extforge-torch-build: replaced in upstream's compile lines: {'; '.join(rewrites)} "
              f"(built for {env.get('EXTFORGE_ARCH_NAMES')}, -std={env.get('EXTFORGE_CXX_STD')}, "
              f"--threads {env.get('NVCC_THREADS')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
