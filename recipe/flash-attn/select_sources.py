"""Edit flash-attn's unpacked sdist before it is built: which kernels, in which order.

Run by build.sh with the host python, in the source folder:

  EXTFORGE_UNIT_ORDER  units (source file stems, ';'-separated) longest first, from
                       extforge's per-unit cost data: ninja starts the compiles in the order
                       of the extension's `sources`, so the longest ones must not come last.
                       setuptools sorts `sources` by name before compiling (for a reproducible
                       link), which put flash-attn's longest units (flash_fwd_split_*) last
                       whatever setup.py listed; the extension's sources become strs that
                       sort by their place in this order instead (set on the Extension object,
                       whose .pyx mapping, which would make them plain strs again, is switched
                       off: flash-attn has no .pyx sources).
  FLASH_ATTN_HEAD_DIMS head dims to build ("128", "64;128"); empty or "all" builds every one.
                       The kernels of other head dims are dropped from `sources`, and the
                       head-dim dispatch (HEADDIM_SWITCH in static_switch.h) is rewritten so
                       that a call with another head dim raises a ValueError naming the built
                       ones, instead of the module failing to load on an undefined symbol.
  EXTFORGE_SHARD_UNITS kernel units to shard in two translation units (shard_units.py), chosen
                       by the planner when a unit alone would set the build's wall time; units
                       of other head dims than the built ones are ignored.

The planner's two reach the build through extforge-torch-build's settings (what `extforge build`
decided for the variant); the layer also raises upstream's -std=c++17 to the standard torch's
headers require at every compile. Standalone on purpose (the build env has no extforge);
tests/recipe/test_select_sources.py runs it on the real sdist.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import shard_units

UPSTREAM_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
SOURCE_LINE = re.compile(r'^(?P<indent>\s*)"(?P<path>csrc/flash_attn/(?:src/)?(?P<stem>[\w]+)\.(?:cu|cpp))",\s*$')
KERNEL = re.compile(r"^flash_(?:fwd_split|fwd|bwd)_hdim(?P<hdim>\d+)_")
SWITCH = re.compile(r"#define HEADDIM_SWITCH\(HEADDIM, \.\.\.\).*?\}\(\)\n", re.S)


def parse_head_dims(text: str) -> tuple[int, ...]:
    text = text.strip()
    if not text or text == "all":
        return ()
    dims = tuple(sorted({int(d) for d in re.split(r"[;, ]+", text) if d}))
    unknown = [d for d in dims if d not in UPSTREAM_HEAD_DIMS]
    if unknown:
        raise SystemExit(f"error: FLASH_ATTN_HEAD_DIMS={text}: flash-attn has kernels for head dims "
                         f"{', '.join(map(str, UPSTREAM_HEAD_DIMS))} only, not {', '.join(map(str, unknown))}")
    return dims


def source_block(lines: list[str]) -> tuple[int, int]:
    """[first, last) line indices of flash_attn_2_cuda's source list entries."""
    start = next((i for i, line in enumerate(lines) if 'name="flash_attn_2_cuda"' in line), None)
    first = next((i for i in range(start, len(lines)) if SOURCE_LINE.match(lines[i])), None) if start is not None else None
    if first is None:
        raise SystemExit("error: setup.py has no flash_attn_2_cuda source list of the expected shape "
                         "(one quoted csrc/... path per line); select_sources.py does not fit this flash-attn version")
    last = first
    while last < len(lines) and SOURCE_LINE.match(lines[last]):
        last += 1
    return first, last


# setuptools' build_ext runs `sorted(ext.sources)`; a source of this type sorts by its rank.
RANKED_SOURCE = """
class _extforge_unit(str):  # added by extforge's select_sources.py
    \"\"\"A source path that sorts by its place in the planned compile order, not by name.\"\"\"

    def __new__(cls, path, rank):
        self = super().__new__(cls, path)
        self.rank = rank
        return self

    def __lt__(self, other):
        return (self.rank, str(self)) < (getattr(other, "rank", float("inf")), str(other))

    def __gt__(self, other):
        return (self.rank, str(self)) > (getattr(other, "rank", float("inf")), str(other))

"""


def with_ranked_sources(setup_py: str) -> str:
    """setup.py with RANKED_SOURCE defined at its top (after any `from __future__` import) and the
    flash_attn_2_cuda Extension's sources ranked in their listed order right after it is made."""
    lines = setup_py.splitlines(keepends=True)
    first, last = source_block(lines)
    start = max(i for i in range(first) if "ext_modules.append(" in lines[i])
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    end = next((i for i in range(last, len(lines)) if lines[i].rstrip() == indent + ")"), None)
    if end is None:
        raise SystemExit("error: setup.py's ext_modules.append( of flash_attn_2_cuda has no closing line of the expected "
                         "shape; select_sources.py does not fit this flash-attn version")
    lines[end + 1:end + 1] = [
        f"{indent}ext_modules[-1].sources = [_extforge_unit(s, i) for i, s in enumerate(ext_modules[-1].sources)]\n",
        # setuptools' build_ext maps the sources through re.sub (.pyx -> .c/.cpp) before its sort,
        # which makes them plain strs again; flash-attn has no .pyx sources.
        f"{indent}ext_modules[-1]._convert_pyx_sources_to_lang = lambda: None\n"]
    at = max((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__ import")), default=0)
    return "".join(lines[:at]) + RANKED_SOURCE.lstrip("\n") + "".join(lines[at:])


def edit_sources(setup_py: str, head_dims: tuple[int, ...], order: list[str],
                 shards: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """setup.py with the kernel list filtered to `head_dims`, each unit of `shards` followed by its
    twin, and sorted by `order` (units not in it keep upstream's relative order, after the
    ordered ones), each source ranked so that setuptools' sort keeps that order; also returns
    the kept stems."""
    lines = setup_py.splitlines(keepends=True)
    first, last = source_block(lines)
    entries = [(SOURCE_LINE.match(line)["stem"], line) for line in lines[first:last]]
    if head_dims:
        entries = [(s, line) for s, line in entries
                   if not (m := KERNEL.match(s)) or int(m["hdim"]) in head_dims]
    entries = [e for s, line in entries for e in
               ([(s, line), (s + shard_units.SUFFIX, line.replace(f"/{s}.", f"/{s}{shard_units.SUFFIX}."))]
                if s in shards else [(s, line)])]
    rank = {stem: i for i, stem in enumerate(order)}
    entries.sort(key=lambda e: rank.get(e[0], len(rank)))  # stable: the rest keep their order
    lines[first:last] = [line for _, line in entries]
    text = "".join(lines)
    return (with_ranked_sources(text) if order else text), [s for s, _ in entries]


def head_dim_switch(head_dims: tuple[int, ...]) -> str:
    """HEADDIM_SWITCH for a subset: upstream rounds a head dim up to the next kernel
    (32, 64, 96, 128, 192, 256); a head dim whose kernel is not built throws."""
    built = ", ".join(map(str, head_dims))
    out = ["#define HEADDIM_SWITCH(HEADDIM, ...)   \\", "  [&] {                                    \\"]
    lower = 0
    for dim in UPSTREAM_HEAD_DIMS:
        if dim in head_dims:
            out += [f"    if ({lower} < HEADDIM && HEADDIM <= {dim}) {{ \\",
                    f"      constexpr static int kHeadDim = {dim};  \\",
                    "      return __VA_ARGS__();                \\",
                    "    }                                      \\"]
        lower = dim
    out += ["    throw std::invalid_argument(           \\",
            "        \"flash-attn: head dim \" + std::to_string(HEADDIM) + \\",
            f"        \" is not built in this package (built head dims: {built}; \" \\",
            "        \"install the full flash-attn build for other head dims)\"); \\",
            "  }()", ""]
    return "\n".join(out)


def edit_switch(header: str, head_dims: tuple[int, ...]) -> str:
    if not SWITCH.search(header):
        raise SystemExit("error: static_switch.h has no HEADDIM_SWITCH of the expected shape; "
                         "the head-dim subset patch does not fit this flash-attn version")
    header = SWITCH.sub(lambda _: head_dim_switch(head_dims), header, count=1)
    return header.replace("#pragma once\n", "#pragma once\n\n#include <stdexcept>\n#include <string>\n", 1)


def main(root: Path) -> int:
    head_dims = parse_head_dims(os.environ.get("FLASH_ATTN_HEAD_DIMS", ""))
    order = [u for u in os.environ.get("EXTFORGE_UNIT_ORDER", "").split(";") if u]
    wanted = frozenset(u for u in os.environ.get("EXTFORGE_SHARD_UNITS", "").split(";") if u)
    setup_py = root / "setup.py"
    text, kept = edit_sources(setup_py.read_text(), head_dims, order, wanted)
    # Units of head dims not built got no twin, so they are not split either.
    shards = [u for u in kept if u + shard_units.SUFFIX in kept]
    if shards:
        shard_units.shard(root / "csrc" / "flash_attn" / "src", shards)
    setup_py.write_text(text)
    if head_dims:
        switch = root / "csrc" / "flash_attn" / "src" / "static_switch.h"
        switch.write_text(edit_switch(switch.read_text(), head_dims))
    print(f"select_sources: {len(kept)} units"
          f"{', head dims ' + ';'.join(map(str, head_dims)) if head_dims else ', every head dim'}"
          f"{f', {len(shards)} sharded in two' if shards else ''}"
          f"{', longest first' if order else ', upstream order'}: {' '.join(kept[:4])} ...", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()))
