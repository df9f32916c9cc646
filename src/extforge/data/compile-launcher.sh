#!/usr/bin/env bash
# The compile cache in front of every compiler call of a recipe build (extforge.compile_cache),
# so that builds in different output folders (another admin's, another job's) share its entries.
# The cache keys on the preprocessed text, whose line markers name each header by the path the
# compile reached it through; two things made those paths differ between output folders:
#   - rattler-build pads the host prefix's folder name to a fixed length of its whole path, so
#     the headers of torch and Python had another name in every output folder of another length:
#     a compile passes the prefix through a link of one name in the work folder instead (compiles
#     only: a link's rpath must name the prefix);
#   - with the cache's base folder at /, the system's headers (/usr/include) were rewritten
#     relative to the compiler's folder, i.e. by how deep the output folder lay: the base is the
#     build's own folder (work folder, host and build envs), so only its paths become relative.
# The cache's folder (extforge.compile_cache: this user's alone) is opened here and checked on
# that descriptor, and the tool reaches it through the descriptor (/proc/self/fd/N, which its
# sccache server inherits): a folder renamed or swapped on the way after the check changes
# nothing, and one that fails the check is not used (the compiler alone; said on stderr).
# Called as: compile-launcher.sh CACHE COMPILER ARGS...  (CACHE may be empty: the compiler alone)
set -uo pipefail
cache=$1
shift
if [[ -n "${cache}" ]]; then
    for var in CCACHE_DIR SCCACHE_DIR; do
        [[ -n "${!var:-}" ]] || continue
        owner_mode=""
        { exec {pin}<"${!var}"; } 2>/dev/null && owner_mode=$(stat -L -c '%u %a' "/proc/$$/fd/${pin}" 2>/dev/null)
        if [[ -z "${owner_mode}" || "${owner_mode% *}" != "${EUID}" ]] || (( 8#${owner_mode#* } & 8#077 )); then
            echo "extforge: compiling without the compile cache: ${!var} is not a folder of yours alone (mode 700)" >&2
            cache=""
            break
        fi
        [[ ${var} == SCCACHE_DIR && -n "${SCCACHE_SERVER_UDS:-}" ]] && export SCCACHE_SERVER_UDS="/proc/self/fd/${pin}/${SCCACHE_SERVER_UDS##*/}"
        export "${var}=/proc/self/fd/${pin}"
    done
fi
compiles=0
for a in "$@"; do
    case $a in -c|--compile|-dc|--device-c) compiles=1 ;; esac
done
if ((compiles)) && [[ -n "${SRC_DIR:-}" ]]; then
    [[ -n "${CCACHE_BASEDIR:-}" ]] && export CCACHE_BASEDIR="${SRC_DIR%/*}"
    if [[ -n "${PREFIX:-}" && -d "${PREFIX}" ]]; then
        host="${SRC_DIR}/.extforge-host"
        [[ -L "${host}" ]] || ln -sn "${PREFIX}" "${host}" 2>/dev/null || true
        set -- "${@//"${PREFIX}"/"${host}"}"
    fi
fi
# shellcheck disable=SC2086 # CACHE is one executable, or empty for none
exec ${cache} "$@"
