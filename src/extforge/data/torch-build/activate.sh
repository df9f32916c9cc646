# extforge-torch-build: what every torch extension build needs, for any recipe that lists the
# package in its build requirements. Sourced by rattler-build (and conda-build) when the build
# env is activated, after the host env and before the recipe's script, in the script's own shell:
#   - no network: the script runs in a network namespace where the machine allows one, else
#     behind a proxy to nowhere; every Python process of the build refuses to resolve or connect
#     to a non-local address (sitecustomize), and any attempt fails the build at its end;
#   - the GPU archs are the variant's: nvcc goes through extforge-nvcc, which replaces upstream's
#     own -gencode/-arch flags with TORCH_CUDA_ARCH_LIST (or refuses them; or, for a recipe whose
#     units each compile for archs of their own, keeps those of them the variant names);
#   - the C++ ABI and standard come from the host torch; MAX_JOBS / NVCC_THREADS, the planner's
#     unit settings and the compile cache come from `extforge build` (its settings file), else
#     safe defaults;
#   - a build record ($PREFIX/share/extforge/build/$PKG_NAME.json) and ninja's log go into the package.
# A recipe with steps of its own (a build script that picks or splits the sources) runs them in
# the same shell, after this: it reads what is exported here and adds its own facts to the build
# record through EXTFORGE_RECORD_EXTRA (a JSON object; the layer's own keys win).
# Runs under the host env's bash with `set -e`; every failure says what and how to fix it.

_xf_share="${BUILD_PREFIX}/share/extforge-torch-build"
_xf_state="${SRC_DIR}/.extforge"

_xf_fail() {
    echo "error: extforge-torch-build: $*" >&2
    exit 1
}

if [[ -z "${EXTFORGE_LAYER:-}" ]]; then
    export EXTFORGE_LAYER=active
    mkdir -p "${_xf_state}/bin"

    # --- What `extforge build` decided for this variant (planner, compile cache) ---------------
    # Read only when this user owns it and no one else may write it: the output folder of a build
    # can be shared, and whoever writes this file decides what the build runs.
    _xf_settings="${BUILD_DIR:-/nonexistent}/../extforge-build-settings.sh"
    if [[ -f "${_xf_settings}" && -O "${_xf_settings}" && -z "$(find "${_xf_settings}" -perm /022)" ]]; then
        # shellcheck disable=SC1090
        source "${_xf_settings}"
        export EXTFORGE_SETTINGS_FROM="${_xf_settings}"
    fi
    # Known prebuilt-wheel switches (data: extforge's download-switches.yaml): build, never download.
    # shellcheck disable=SC1091
    source "${_xf_share}/switches.sh"

    # --- The host torch: ABI, version, CUDA, C++ standard (one import) -------------------------
    # shellcheck source=torch_facts.sh
    source "${_xf_share}/torch_facts.sh"
    export CPPFLAGS="${CPPFLAGS:-} -D_GLIBCXX_USE_CXX11_ABI=${EXTFORGE_TORCH_ABI}"
    export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -D_GLIBCXX_USE_CXX11_ABI=${EXTFORGE_TORCH_ABI}"
    # Upstream switches that pick the ABI themselves (data: switches.sh) must agree with torch.
    for _xf_v in ${_xf_abi_switches}; do
        if [[ "${EXTFORGE_TORCH_ABI}" == 1 ]]; then export "${_xf_v}=TRUE"; else export "${_xf_v}=FALSE"; fi
    done
    # The shared libstdc++ that torch loads, never a private static copy: a g++ with only
    # libstdc++.a beside it (some relocated toolchains) links the runtime into the module and
    # exports it; `extforge audit` refuses that, so stop before a long compile.
    if [[ -n "${CXX:-}" && ! -e "$("${CXX}" -print-file-name=libstdc++.so)" ]]; then
        _xf_fail "${CXX} finds no libstdc++.so and would link libstdc++.a into the module (a second C++ runtime" \
                 "beside torch's libstdc++.so.6); build with conda's gxx or a g++ that has libstdc++.so"
    fi
    # pip builds a wheel only to unpack it into $PREFIX: deflating a 200+ MiB module took ~10 s of a
    # 32-core node's build for an archive that lives seconds (rattler-build compresses the package
    # itself). setuptools reads DIST_EXTRA_CONFIG after setup.cfg.
    printf '[bdist_wheel]\ncompression = stored\n' > "${_xf_state}/wheel.cfg"
    export DIST_EXTRA_CONFIG="${_xf_state}/wheel.cfg"

    # --- GPU archs: the variant's, as TORCH_CUDA_ARCH_LIST (the recipe maps cuda_archs to it) ----
    [[ -n "${TORCH_CUDA_ARCH_LIST:-}" ]] || _xf_fail "no GPU arch list: add \`TORCH_CUDA_ARCH_LIST: \${{ cuda_archs }}\` to build.script.env and cuda_archs to variants.yaml (e.g. [\"9.0\"])"
    _xf_arch=$("${PYTHON}" "${_xf_share}/archs.py" "${TORCH_CUDA_ARCH_LIST}") || _xf_fail "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} is not a list of compute capabilities (e.g. \"8.0;9.0\" or \"9.0a+PTX\")"
    read -r EXTFORGE_GENCODE_LIST EXTFORGE_ARCH_NAMES CUDAARCHS <<< "${_xf_arch}"
    export EXTFORGE_GENCODE_LIST EXTFORGE_ARCH_NAMES CUDAARCHS
    export CMAKE_CUDA_ARCHITECTURES="${CUDAARCHS}"
    export EXTFORGE_ARCH_FLAGS="${EXTFORGE_ARCH_FLAGS:-rewrite}"

    # --- Jobs: the planner's, else as many as fit 4 GiB per compile (nvcc on a template-heavy
    # kernel peaks there), never more than the cores ------------------------------------------
    if [[ -z "${MAX_JOBS:-}" ]]; then
        _xf_avail_gib=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 8)
        MAX_JOBS=$(( (_xf_avail_gib - 4) / 4 ))
        (( MAX_JOBS > ${CPU_COUNT:-1} )) && MAX_JOBS=${CPU_COUNT:-1}
        (( MAX_JOBS < 1 )) && MAX_JOBS=1
    fi
    export MAX_JOBS NVCC_THREADS="${NVCC_THREADS:-1}" CMAKE_BUILD_PARALLEL_LEVEL="${MAX_JOBS}"

    # --- Compilers: nvcc and g++ through wrappers that enforce the above ------------------------
    EXTFORGE_REAL_NVCC="${CUDA_HOME:+${CUDA_HOME}/bin/nvcc}"
    [[ -x "${EXTFORGE_REAL_NVCC:-}" ]] || EXTFORGE_REAL_NVCC=$(command -v nvcc || true)
    [[ -x "${EXTFORGE_REAL_NVCC}" ]] || _xf_fail "no nvcc in the build env; list \${{ compiler('cuda') }} in the recipe's build requirements"
    # The wrappers find their shared rules (wrappers.sh) here.
    export EXTFORGE_LAYER_SHARE="${_xf_share}"
    export EXTFORGE_REAL_NVCC EXTFORGE_REWRITES_LOG="${_xf_state}/rewrites.log" EXTFORGE_SPLIT_LOG="${_xf_state}/split.log"
    : > "${EXTFORGE_REWRITES_LOG}"
    : > "${EXTFORGE_SPLIT_LOG}"
    # torch.utils.cpp_extension runs PYTORCH_NVCC; CMake's CUDA language runs CUDACXX; torch's
    # setuptools path without ninja (torch-scatter) runs $CUDA_HOME/bin/nvcc; a script, plain nvcc.
    export PYTORCH_NVCC="${BUILD_PREFIX}/bin/extforge-nvcc" CUDACXX="${BUILD_PREFIX}/bin/extforge-nvcc"
    ln -sfn "${BUILD_PREFIX}/bin/extforge-nvcc" "${_xf_state}/bin/nvcc"
    export PATH="${_xf_state}/bin:${PATH}"
    if [[ -n "${CUDA_HOME:-}" && -d "${CUDA_HOME}/bin" ]]; then
        # A CUDA_HOME of links to the real one, but bin/nvcc: the wrapper.
        mkdir -p "${_xf_state}/cuda/bin"
        for _xf_e in "${CUDA_HOME}"/*; do
            [[ "$(basename "${_xf_e}")" == bin ]] || ln -sfn "${_xf_e}" "${_xf_state}/cuda/"
        done
        for _xf_e in "${CUDA_HOME}"/bin/*; do ln -sfn "${_xf_e}" "${_xf_state}/cuda/bin/"; done
        ln -sfn "${BUILD_PREFIX}/bin/extforge-nvcc" "${_xf_state}/cuda/bin/nvcc"
        export CUDA_HOME="${_xf_state}/cuda" CUDA_PATH="${_xf_state}/cuda"
    fi
    # torch >= 2.14 would prepend a ccache/sccache found on PATH by itself; only extforge decides.
    export TORCH_NO_COMPILER_WRAPPER=1
    if [[ -n "${CXX:-}" ]]; then
        # torch runs `which $CXX` and `$CXX -v`: CXX stays one executable with the compiler's name.
        export EXTFORGE_REAL_CXX
        EXTFORGE_REAL_CXX=$(command -v "${CXX}")
        printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "${_xf_share}/cxx-wrapper.sh" "${EXTFORGE_REAL_CXX}" \
            > "${_xf_state}/bin/$(basename "${EXTFORGE_REAL_CXX}")"
        chmod +x "${_xf_state}/bin/$(basename "${EXTFORGE_REAL_CXX}")"
        export CXX="${_xf_state}/bin/$(basename "${EXTFORGE_REAL_CXX}")"
    fi
    for _xf_v in CCACHE_DIR CCACHE_UMASK CCACHE_BASEDIR CCACHE_NOHASHDIR CCACHE_COMPILERCHECK CCACHE_MAXSIZE SCCACHE_DIR \
        SCCACHE_SERVER_UDS SCCACHE_BASEDIRS; do
        [[ -z "${!_xf_v:-}" ]] && unset "${_xf_v}"
    done
    if [[ -n "${EXTFORGE_COMPILER_LAUNCHER:-}" ]]; then
        # torch's include paths name lib/pythonX.Y/site-packages, so two Python versions preprocess
        # the same .cu to different text and never share a cache entry. Reached through a link whose
        # name does not carry the version, they preprocess alike (the -I options themselves are not
        # in ccache's preprocessor-mode key) and a second Python version reuses the kernel objects.
        ln -sfn "$("${PYTHON}" -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("torch").origin)))')" \
            "${_xf_state}/site"
        export PYTHONPATH="${_xf_state}/site${PYTHONPATH:+:${PYTHONPATH}}"
    fi

    # --- Upstream's own arch / thread / standard flags, named before the compile --------------
    "${PYTHON}" "${_xf_share}/scan_flags.py" "${SRC_DIR}" "${EXTFORGE_ARCH_FLAGS}" "${EXTFORGE_ARCH_NAMES}" \
        || _xf_fail "upstream's build files fix GPU archs that differ from the variant's (above); EXTFORGE_ARCH_FLAGS=refuse was asked for"
    # Which units could compile as parallel parts, for the planner's next build of the recipe.
    "${PYTHON}" "${_xf_share}/split_unit.py" --count "${SRC_DIR}" || true

    export EXTFORGE_RECORD_EXTRA="${_xf_state}/record-extra.json"

    # --- No network ----------------------------------------------------------------------------
    export PYTHONPATH="${_xf_share}/python${PYTHONPATH:+:${PYTHONPATH}}"
    export EXTFORGE_NETWORK_LOG="${_xf_state}/network.log"
    : > "${EXTFORGE_NETWORK_LOG}"
    export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 GIT_ALLOW_PROTOCOL=file
    # Processes that are not Python (curl, git, CMake's FetchContent) meet a proxy that refuses.
    export http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
        HTTPS_PROXY=http://127.0.0.1:9 ALL_PROXY=http://127.0.0.1:9 no_proxy= NO_PROXY=
    EXTFORGE_NETWORK=proxy
    # A network namespace removes the network for every process: the script is run again inside
    # one (its environment, set up above, carries over; the activation does not run twice).
    if [[ "$(basename -- "$0")" == conda_build.sh && -r "$0" ]]; then
        _xf_unshare=(unshare --net)
        [[ "$(id -u)" != 0 ]] && _xf_unshare=(unshare --map-root-user --net)
        if "${_xf_unshare[@]}" true 2>/dev/null; then
            export EXTFORGE_NETWORK=namespace
            exec "${_xf_unshare[@]}" -- bash -c '
                ip link set lo up 2>/dev/null || true   # loopback for a local sccache server
                source "$1"; source "$2"' _ "${_xf_share}/in-build.sh" "$0"
        fi
    fi
    export EXTFORGE_NETWORK
fi
# shellcheck disable=SC1091
source "${_xf_share}/in-build.sh"
