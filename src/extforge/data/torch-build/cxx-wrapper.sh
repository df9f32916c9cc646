#!/usr/bin/env bash
# The C++ compiler as extforge-torch-build wants it: a -std below the one the host torch's headers
# require becomes torch's (mamba-ssm passes -std=c++17, which torch 2.14's headers refuse), and
# the compile cache launcher goes in front. Called as: cxx-wrapper.sh REAL_CXX ARGS...
set -euo pipefail
real=$1; shift
log=${EXTFORGE_REWRITES_LOG:-/dev/null}
std_rank() { case $1 in c++11|gnu++11) echo 11;; c++14|gnu++14) echo 14;; c++17|gnu++17) echo 17;; c++20|gnu++20) echo 20;; c++23|gnu++23) echo 23;; *) echo 0;; esac; }
want=${EXTFORGE_CXX_STD:-}
args=()
for a in "$@"; do
    if [[ -n "$want" && "$a" == -std=* ]] && (( $(std_rank "${a#-std=}") < $(std_rank "$want") )); then
        grep -qxF -- "std: $a" "$log" 2>/dev/null || printf 'std: %s\n' "$a" >> "$log"
        a="-std=$want"
    fi
    args+=("$a")
done
# shellcheck disable=SC2086 # the launcher may be a command with arguments
exec ${EXTFORGE_COMPILER_LAUNCHER:-} "$real" "${args[@]}"
