#!/usr/bin/env bash
# Builds flash-attn against the host environment's PyTorch. Shared by recipe.yaml
# (rattler-build) and meta.yaml (conda-build), so both produce the same package.
set -euo pipefail

py_tag=$("${PYTHON}" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

# --- The host torch, from one import (the layer's torch_facts.py, which also refuses a torch whose
# cpp_extension passes another _GLIBCXX_USE_CXX11_ABI than torch was built with): its C++ ABI,
# version and CUDA (for the build record) and the C++ standard its headers require. The shared
# libstdc++ is checked and pip's wheel set to stored too.
source "${BUILD_PREFIX}/share/extforge-torch-build/compiler_checks.sh"

# --- C++ ABI: the host torch decides, never the compiler's default -------------------------
# Older torch adds -D_GLIBCXX_USE_CXX11_ABI=<n> itself; newer torch passes nothing and relies
# on the compiler. Either way, what reaches the compilers must equal torch's ABI.
compiler_default_abi=$(echo '#include <string>' | "${CXX}" -x c++ -dM -E - \
    | awk '$2 == "_GLIBCXX_USE_CXX11_ABI" {print $3}')
# Pass torch's value explicitly to g++ (CPPFLAGS reaches cpp_extension's compile line)
# and to nvcc (NVCC_APPEND_FLAGS reaches every nvcc call, host and device side).
export CPPFLAGS="${CPPFLAGS:-} -D_GLIBCXX_USE_CXX11_ABI=${EXTFORGE_TORCH_ABI}"
export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -D_GLIBCXX_USE_CXX11_ABI=${EXTFORGE_TORCH_ABI}"
if [[ "${EXTFORGE_TORCH_ABI}" == "1" ]]; then
    export FLASH_ATTENTION_FORCE_CXX11_ABI=TRUE
fi

# --- Link: a symbol missing from the build-time libtorch fails here, not on a user's node ----
libpython=""
read -r py_libdir py_soname < <("${PYTHON}" -c 'import sysconfig as s; print(s.get_config_var("LIBDIR"), s.get_config_var("INSTSONAME") or "-")')
if [[ -e "${py_libdir}/${py_soname}" ]]; then
    libpython="${py_soname}"
    # --as-needed (conda-forge's default LDFLAGS) would drop libpython, listed before the objects.
    export LDFLAGS="${LDFLAGS:-} -Wl,--no-undefined -L${py_libdir} -Wl,--push-state,--no-as-needed -l:${py_soname} -Wl,--pop-state"
else
    echo "warning: no shared libpython at ${py_libdir}/${py_soname}; linking without --no-undefined" >&2
fi

echo "flash-attn build: python ${py_tag}, torch ABI ${EXTFORGE_TORCH_ABI} (compiler default ${compiler_default_abi:-?})," \
     "-std=${EXTFORGE_CXX_STD}, archs ${FLASH_ATTN_CUDA_ARCHS}, head dims ${FLASH_ATTN_HEAD_DIMS:-all}, MAX_JOBS=${MAX_JOBS} NVCC_THREADS=${NVCC_THREADS}," \
     "launcher '${EXTFORGE_COMPILER_LAUNCHER:-}'" >&2

# --- Which kernels, in which order (select_sources.py) ------------------------------------------
# It also raises upstream's -std=c++17 (host and device code) to EXTFORGE_CXX_STD.
"${PYTHON}" "${RECIPE_DIR}/select_sources.py" .

# compiler_checks.sh has set pip's wheel to stored (DIST_EXTRA_CONFIG).
"${PYTHON}" -m pip install . --no-deps --no-build-isolation --no-index -vv

# Where the interpreter finds it (found, not loaded): site-packages on conda-forge's python,
# a dist-packages folder on a Debian/Ubuntu python mirrored from a node.
ext=$("${PYTHON}" -c 'import importlib.util as u; print(u.find_spec("flash_attn_2_cuda").origin)')
if [[ -n "${libpython}" ]]; then
    # libpython was only there for the link check; at run time the interpreter provides
    # Python's symbols, as for every extension module (a static python must not load a 2nd copy).
    patchelf --remove-needed "${libpython}" "${ext}"
fi

mkdir -p "${PREFIX}/share/extforge/build"
# ninja's own per-unit start/end times: what `extforge plan`'s longest-first order is measured from.
ninja_log=$(find build -name .ninja_log -print -quit 2>/dev/null || true)
if [[ -n "${ninja_log}" ]]; then
    cp "${ninja_log}" "${PREFIX}/share/extforge/build/flash-attn.ninja_log"
fi
"${PYTHON}" - "${ext}" "${EXTFORGE_TORCH_ABI}" "${compiler_default_abi:-}" "${libpython}" "${EXTFORGE_CXX_STD}" \
    "${EXTFORGE_TORCH_VERSION}" "${EXTFORGE_TORCH_CUDA}" <<'PY' > "${PREFIX}/share/extforge/build/flash-attn.json"
import json, os, sys
ext, abi, compiler_default, libpython, cxx_std, torch_version, torch_cuda = sys.argv[1:]
print(json.dumps({
    "schema": 1,
    "name": "flash-attn",
    "extension": os.path.basename(ext),
    "cxx11_abi": abi == "1",
    "cxx_std": cxx_std,
    "compiler_default_cxx11_abi": compiler_default == "1" if compiler_default else None,
    "torch": torch_version,
    "torch_cuda": None if torch_cuda == "None" else torch_cuda,
    "cuda_archs": os.environ["FLASH_ATTN_CUDA_ARCHS"].split(";"),
    "head_dims": os.environ.get("FLASH_ATTN_HEAD_DIMS") or "all",
    "linked_no_undefined": bool(libpython),
    "max_jobs": int(os.environ["MAX_JOBS"]),
    "nvcc_threads": int(os.environ["NVCC_THREADS"]),
}, indent=2, sort_keys=True))
PY
