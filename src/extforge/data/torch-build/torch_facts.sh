# The host torch, from one import (torch_facts.py): EXTFORGE_TORCH_ABI (0/1), EXTFORGE_TORCH_VERSION,
# EXTFORGE_TORCH_CUDA and EXTFORGE_CXX_STD (the C++ standard its headers require). Sourced by
# activate.sh.
_xf_facts=$("${PYTHON}" "${BUILD_PREFIX}/share/extforge-torch-build/torch_facts.py" "${CXX:-c++}") || {
    echo "error: extforge-torch-build: the host env's python cannot import torch (above);" \
         "list pytorch in the recipe's host requirements" >&2
    exit 1
}
read -r EXTFORGE_TORCH_ABI EXTFORGE_TORCH_VERSION EXTFORGE_TORCH_CUDA EXTFORGE_CXX_STD <<< "${_xf_facts}"
export EXTFORGE_TORCH_ABI EXTFORGE_TORCH_VERSION EXTFORGE_TORCH_CUDA EXTFORGE_CXX_STD
