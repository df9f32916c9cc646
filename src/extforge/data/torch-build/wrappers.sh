# What both compiler wrappers of extforge-torch-build (extforge-nvcc, cxx-wrapper.sh) apply the
# same way, sourced by each: the -std rule and the note of each replacement.

# A -std below the one the host torch's headers require (EXTFORGE_CXX_STD, e.g. c++20 for torch
# 2.14) is raised to it: mamba-ssm and gsplat pass -std=c++17, which those headers refuse.
# gnu++NN ranks as c++NN; an unknown value ranks lowest.
std_rank() { case ${1/#gnu/c} in c++11) echo 11;; c++14) echo 14;; c++17) echo 17;; c++20) echo 20;; c++23) echo 23;; *) echo 0;; esac; }
std_below_torch() {  # std_below_torch VALUE
    [[ -n "${EXTFORGE_CXX_STD:-}" ]] && (( $(std_rank "$1") < $(std_rank "${EXTFORGE_CXX_STD}") ))
}

# Each replacement once in EXTFORGE_REWRITES_LOG, which the build record lists.
note() { grep -qxF -- "$1" "${EXTFORGE_REWRITES_LOG:-/dev/null}" 2>/dev/null || printf '%s\n' "$1" >> "${EXTFORGE_REWRITES_LOG:-/dev/null}"; }
