# Part of extforge-torch-build, for recipes with a build script of their own (flash-attn,
# flash-attn-3 list the package with EXTFORGE_LAYER=files and source this from build.sh): the host
# torch (its C++ ABI, version, CUDA and C++ standard, from one import) and the C++ runtime every
# such build needs, checked before any compile, and how their `pip install .` packs the wheel.

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
