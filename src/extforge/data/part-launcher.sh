#!/usr/bin/env bash
# The compile launcher of a build in parts (extforge.building.parts), in front of every compiler call
# of one part (PART 1..PARTS) or of the link job (PART 0):
#   - a unit of this part compiles through the compile cache, which carries its object to the
#     link job; a unit of another part gets an empty placeholder object, never cached;
#   - in a part, a link or device link gets an empty placeholder too, so a build that links each
#     extension before compiling the next (setuptools without ninja) still reaches every unit; what
#     a part build made is never packaged (extforge build removes it);
#   - the link job compiles every unit through the cache: the parts' objects come back as hits.
# Each unit's outcome goes to STATE (one line per call; short appends are atomic), and ccache's
# per-call counters to STATE/ccache-stats.log, for extforge build's report.
# Called as: part-launcher.sh PART PARTS ASSIGNMENT STATE CACHE COMPILER ARGS...
# ASSIGNMENT lies in an output folder others may write: what is read from it is checked to be a
# part number before any arithmetic (bash evaluates a variable's value as an expression there:
# an owner `a[$(cmd)]` would run cmd), and nothing read is ever evaluated.
set -uo pipefail
part=$1 parts=$2 assignment=$3 state=$4 cache=$5
shift 5
if ! [[ $part =~ ^[0-9]{1,5}$ && $parts =~ ^[1-9][0-9]{0,4}$ ]]; then
    echo "error: part-launcher.sh: PART '${part}' and PARTS '${parts}' are not part numbers (extforge build --part I/N)" >&2
    exit 2
fi
export CCACHE_STATSLOG="${state}/ccache-stats.log"

out="" compiles=0 links=0 prev=""
for a in "$@"; do
    [[ "$prev" == -o || "$prev" == --output-file ]] && out=$a
    case $a in
        -c|--compile|-dc|--device-c) compiles=1 ;;
        -shared|-dlink|--device-link) links=1 ;;
        --output-file=*) out=${a#*=} ;;
        -o?*) out=${a#-o} ;;
    esac
    prev=$a
done

if ((links)) && ((part > 0)) && [[ -n "$out" ]]; then
    : > "$out"
    echo "link ${out##*/}" >> "${state}/units"
    exit 0
fi
# Version probes, preprocessing, a link job's link: the compiler as asked.
if ((!compiles)) || [[ -z "$out" ]]; then
    exec "$@"
fi

# The unit's name as extforge.planning.unit_costs.unit_name gives it: the object's name without .o/.obj,
# then without its source suffix.
unit=${out##*/}
for suffix in .o .obj .cu .cpp .cc .cxx; do unit=${unit%"$suffix"}; done
if ((part > 0)); then
    # The unit as a string: from ENVIRON (awk -v would process escapes), `""` appended (awk
    # compares number-like fields as numbers).
    owner=$(unit=$unit awk -F '\t' 'NF == 2 && $1 "" == ENVIRON["unit"] "" { print $2; exit }' "$assignment" 2>/dev/null)
    # A unit the cost data does not know, or an owner that is no part number: by its name's hash,
    # as extforge.building.parts.owner().
    [[ $owner =~ ^[1-9][0-9]{0,4}$ ]] || owner=$(( 16#$(printf '%s' "$unit" | md5sum | cut -c1-8) % parts + 1 ))
    if ((owner != part)); then
        : > "$out"
        echo "skipped $unit $owner" >> "${state}/units"
        exit 0
    fi
fi
start=$SECONDS
# Through the launcher every build uses (the paths that make the cache's key the same in every
# output folder).
bash "$(dirname "${BASH_SOURCE[0]}")/compile-launcher.sh" "${cache}" "$@"
rc=$?
echo "compiled $unit $rc $((SECONDS - start))" >> "${state}/units"
exit "$rc"
