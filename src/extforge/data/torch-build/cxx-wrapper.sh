#!/usr/bin/env bash
# The C++ compiler as extforge-torch-build wants it: a -std below torch's becomes torch's (the rule
# in wrappers.sh, shared with extforge-nvcc), and the compile cache launcher goes in front.
# Called as: cxx-wrapper.sh REAL_CXX ARGS...
set -euo pipefail
real=$1; shift
# shellcheck source=wrappers.sh
source "${EXTFORGE_LAYER_SHARE:?cxx-wrapper.sh runs only inside an extforge-torch-build build env}/wrappers.sh"
args=()
for a in "$@"; do
    if [[ "$a" == -std=* ]] && std_below_torch "${a#-std=}"; then
        note "std: $a"
        a="-std=${EXTFORGE_CXX_STD}"
    fi
    args+=("$a")
done
# shellcheck disable=SC2086 # the launcher may be a command with arguments
exec ${EXTFORGE_COMPILER_LAUNCHER:-} "$real" "${args[@]}"
