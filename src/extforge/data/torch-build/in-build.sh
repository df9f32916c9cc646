# extforge-torch-build, part 2: sourced in the shell that runs the recipe's script (activate.sh).
# When that script ends: a build that tried the network fails, whatever upstream did with the
# error; a build that succeeded gets its build record and ninja's log into the package.
_xf_share="${BUILD_PREFIX}/share/extforge-torch-build"

_xf_finish() {
    local rc=$?
    set +x
    if [[ -s "${EXTFORGE_NETWORK_LOG:-}" ]]; then
        echo "error: extforge-torch-build: the build tried to reach the network; extforge allows no download during a build:" >&2
        sort -u "${EXTFORGE_NETWORK_LOG}" | head -5 | sed 's/^/  /' >&2
        echo "  fix: if upstream's setup.py downloads a prebuilt wheel, set its switch (e.g. FOO_FORCE_BUILD: \"TRUE\") in" \
             "the recipe's build.script.env; if the build needs a file, add it to the recipe's sources" >&2
        exit 1
    fi
    if (( rc == 0 )); then
        "${PYTHON}" "${_xf_share}/record.py" || exit 1
    fi
    exit "${rc}"
}
trap _xf_finish EXIT
