#!/usr/bin/env bash
# Builds FlashAttention-3 (upstream's hopper/) against the host environment's PyTorch through
# its stable C ABI. Shared by recipe.yaml (rattler-build) and meta.yaml (conda-build).
set -euo pipefail

# --- The host torch, from one import (the layer's compiler_checks.sh): its version and CUDA (for
# the build record), the C++ standard its headers demand (c++20 for torch 2.14), a shared libstdc++.
source "${BUILD_PREFIX}/share/extforge-torch-build/compiler_checks.sh"
IFS=. read -r torch_major torch_minor _ <<< "${EXTFORGE_TORCH_VERSION}"
if (( torch_major < 2 || (torch_major == 2 && torch_minor < 9) )); then
    echo "error: FlashAttention-3 is built against torch's stable C ABI, which needs torch >= 2.9;" \
         "this variant's host torch is ${EXTFORGE_TORCH_VERSION}. Build it for a channel row with torch >= 2.9." >&2
    exit 1
fi

# --- Sources: pinned trees, no network, no git, the subset's switches --------------------------
"${PYTHON}" "${RECIPE_DIR}/prepare_sources.py" "${SRC_DIR}" \
    --env-out "${SRC_DIR}/fa3-env.sh" --record-out "${SRC_DIR}/fa3-subset.json"
# shellcheck disable=SC1091
source "${SRC_DIR}/fa3-env.sh"
export FLASH_ATTENTION_OFFLINE_BUILD=1 FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_SKIP_CUDA_BUILD=FALSE

echo "flash-attn-3 build: torch ${EXTFORGE_TORCH_VERSION}, ${EXTFORGE_CXX_STD}, MAX_JOBS=${MAX_JOBS} NVCC_THREADS=${NVCC_THREADS}," \
     "disabled: ${FA3_DISABLED:-none}" >&2

cd "${SRC_DIR}/hopper"
# compiler_checks.sh has set pip's wheel to stored (DIST_EXTRA_CONFIG).
"${PYTHON}" -m pip install . --no-deps --no-build-isolation --no-index -vv
# Out of hopper/: its source folder flash_attn_3/ (no _C) would shadow the installed package.
cd "${SRC_DIR}"

ext=$("${PYTHON}" -c 'import importlib.util as u; print(u.find_spec("flash_attn_3._C").origin)')
mkdir -p "${PREFIX}/share/extforge/build"
ninja_log=$(find hopper/build -name .ninja_log -print -quit 2>/dev/null || true)
if [[ -n "${ninja_log}" ]]; then
    cp "${ninja_log}" "${PREFIX}/share/extforge/build/flash-attn-3.ninja_log"
fi
"${PYTHON}" - "${ext}" "${SRC_DIR}/fa3-subset.json" "${EXTFORGE_TORCH_VERSION}" "${EXTFORGE_TORCH_CUDA}" <<'PY' > "${PREFIX}/share/extforge/build/flash-attn-3.json"
import json, os, sys
ext, subset, torch_version, torch_cuda = sys.argv[1:]
print(json.dumps({
    "schema": 1,
    "name": "flash-attn-3",
    "extension": os.path.basename(ext),
    "torch": torch_version,
    "torch_cuda": None if torch_cuda == "None" else torch_cuda,
    "stable_abi_floor": "2.9",
    "cuda_archs": ["90a"] + (["80"] if "sm80" in json.load(open(subset))["features"] else []),
    "subset": json.load(open(subset)),
    "max_jobs": int(os.environ["MAX_JOBS"]),
    "nvcc_threads": int(os.environ["NVCC_THREADS"]),
}, indent=2, sort_keys=True))
PY
