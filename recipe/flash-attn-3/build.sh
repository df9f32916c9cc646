#!/usr/bin/env bash
# FlashAttention-3's own steps (upstream's hopper/), on top of extforge-torch-build (which has
# already refused the network, set the variant's archs, the C++ standard torch's headers demand,
# the planner's jobs and the compile cache, and writes the build record when this script ends).
# Shared by recipe.yaml (rattler-build) and meta.yaml (conda-build).
set -euo pipefail

# Built against torch's stable C ABI, which torch has from 2.9 on.
IFS=. read -r torch_major torch_minor _ <<< "${EXTFORGE_TORCH_VERSION}"
if (( torch_major < 2 || (torch_major == 2 && torch_minor < 9) )); then
    echo "error: FlashAttention-3 is built against torch's stable C ABI, which needs torch >= 2.9;" \
         "this variant's host torch is ${EXTFORGE_TORCH_VERSION}. Build it for a channel row with torch >= 2.9." >&2
    exit 1
fi

# The variant's kernel subset as upstream's FLASH_ATTENTION_DISABLE_* switches (subset.py, which
# also adds the subset to the build record).
switches=$("${PYTHON}" "${RECIPE_DIR}/subset.py")
eval "${switches}"

cd "${SRC_DIR}/hopper"
"${PYTHON}" -m pip install . --no-deps --no-build-isolation -vv
