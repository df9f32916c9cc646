# Part of extforge-torch-build, for recipes with a build script of their own (flash-attn,
# flash-attn-3 list the package with EXTFORGE_LAYER=files and source this from build.sh): the host
# torch (its C++ ABI, version, CUDA and C++ standard, from one import) and the C++ runtime every
# such build needs, checked before any compile, how their `pip install .` packs the wheel, and
# the compile cache `extforge build` chose (its launcher in front of nvcc and the C++ compiler).

# --- The host torch: C++ ABI, version, CUDA and the C++ standard its headers require ----------
# shellcheck source=torch_facts.sh
source "${BUILD_PREFIX}/share/extforge-torch-build/torch_facts.sh"

# --- C++ runtime: the shared libstdc++ that torch loads, never a private static copy ----------
# A g++ with only libstdc++.a beside it (some relocated toolchains) links the runtime into the
# module and exports it; `extforge audit` refuses that, so stop before a long compile.
if [[ ! -e "$("${CXX}" -print-file-name=libstdc++.so)" ]]; then
    echo "error: ${CXX} finds no libstdc++.so and would link libstdc++.a into the module (a second" \
         "C++ runtime beside torch's libstdc++.so.6); build with conda's gxx or a g++ that has libstdc++.so" >&2
    exit 1
fi

# --- pip's wheel: stored, not deflated ---------------------------------------------------------
# pip builds a wheel only to unpack it into ${PREFIX}: deflating the full kernel set's 200+ MiB
# module took ~10 s of a 32-core node's build for an archive that lives seconds (rattler-build
# compresses the package itself). setuptools reads DIST_EXTRA_CONFIG after setup.cfg.
printf '[bdist_wheel]\ncompression = stored\n' > "${SRC_DIR}/.extforge-wheel.cfg"
export DIST_EXTRA_CONFIG="${SRC_DIR}/.extforge-wheel.cfg"

# --- Compile cache (extforge.compile_cache; a split build's part launcher) -------------------------
# torch >= 2.14 prepends any ccache/sccache found on PATH by itself; only extforge decides.
export TORCH_NO_COMPILER_WRAPPER=1
if [[ -n "${EXTFORGE_COMPILER_LAUNCHER:-}" ]]; then
    _xf_nvcc="${CUDA_HOME:+${CUDA_HOME}/bin/nvcc}"
    _xf_nvcc="${_xf_nvcc:-$(command -v nvcc)}"
    export PYTORCH_NVCC="${EXTFORGE_COMPILER_LAUNCHER} ${_xf_nvcc}"
    # torch runs `which $CXX` and `$CXX -v`, so CXX stays one executable: a wrapper script.
    _xf_real_cxx=$(command -v "${CXX}")
    _xf_wrap_dir="${SRC_DIR}/.extforge-bin"
    mkdir -p "${_xf_wrap_dir}"
    printf '#!/bin/sh\nexec %s %s "$@"\n' "${EXTFORGE_COMPILER_LAUNCHER}" "${_xf_real_cxx}" > "${_xf_wrap_dir}/$(basename "${_xf_real_cxx}")"
    chmod +x "${_xf_wrap_dir}/$(basename "${_xf_real_cxx}")"
    export CXX="${_xf_wrap_dir}/$(basename "${_xf_real_cxx}")"
    # torch's include paths name lib/pythonX.Y/site-packages, so two Python versions preprocess
    # the same .cu to different text and never share a cache entry. Reached through a link whose
    # name does not carry the version, they preprocess alike (the -I options themselves are not
    # in ccache's preprocessor-mode key) and a second Python version reuses the kernel objects.
    ln -sfn "$("${PYTHON}" -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("torch").origin)))')" \
        "${SRC_DIR}/.extforge-site"
    export PYTHONPATH="${SRC_DIR}/.extforge-site${PYTHONPATH:+:${PYTHONPATH}}"
    for _xf_v in CCACHE_DIR CCACHE_UMASK CCACHE_BASEDIR CCACHE_NOHASHDIR CCACHE_COMPILERCHECK CCACHE_MAXSIZE SCCACHE_DIR \
        SCCACHE_SERVER_UDS SCCACHE_BASEDIRS; do
        [[ -z "${!_xf_v:-}" ]] && unset "${_xf_v}"
    done
fi
