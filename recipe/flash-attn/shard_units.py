"""Split a flash-attn kernel unit in two translation units, so that its halves compile in parallel.

A head-dim subset build has fewer units than a build node has job slots, and its wall time is
then the compile time of its longest unit (a split-kv forward: ~390 s on an H100 node, while the
shortest take ~200 s). Each kernel unit instantiates its kernels over a runtime switch; the
split moves one side of that switch into a second translation unit:

  flash_fwd_hdim*/flash_bwd_hdim*   the dropout switch (run_mha_{fwd,bwd}_hdimD): the kernels
                                    with dropout go to the new unit
  flash_fwd_split_hdim*             the num_splits > 1 switch (run_flash_splitkv_fwd): the kernels
                                    that write partial results go to the new unit (both halves
                                    also compile the small combine kernels that follow it)

The launch templates get one more template parameter, `int Shard = -1`: -1 keeps upstream's
runtime switch (every unit not split compiles exactly as before), 0 or 1 fixes that switch to one
side. A split unit calls the side it needs at run time and declares side 1 `extern template`;
`<unit>_shard1.cu` instantiates side 1. The kernels themselves are unchanged, only where they
are instantiated moves, and every entry point keeps its symbol (flash_api.cpp is untouched).

Standalone (the build env has no extforge); select_sources.py applies it for the units named in
EXTFORGE_SHARD_UNITS, which extforge's planner chooses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SUFFIX = "_shard1"

SHARD_SWITCH = """
// extforge: one side of a runtime switch per translation unit (shard_units.py). SHARD -1 keeps
// the runtime switch; 0 or 1 compiles only that side, the other being instantiated elsewhere.
#define FLASH_SHARD_SWITCH(SHARD, SWITCH, COND, CONST_NAME, ...)  \\
  [&] {                                                           \\
    if constexpr ((SHARD) >= 0) {                                 \\
      constexpr static bool CONST_NAME = (SHARD) == 1;            \\
      return __VA_ARGS__();                                       \\
    } else {                                                      \\
      return SWITCH(COND, CONST_NAME, __VA_ARGS__);               \\
    }                                                             \\
  }()
"""


@dataclass(frozen=True)
class Axis:
    """The switch a kind of unit is split on, and the function whose template gets `Shard`."""

    header: str  # launch template (in csrc/flash_attn/src)
    function: str  # regex of the templated function(s) that get the Shard parameter
    switch: str  # the switch macro inside it
    cond: str  # its runtime condition (the split unit tests it to pick a side)
    const: str  # the constexpr bool it defines


FWD = Axis("flash_fwd_launch_template.h", r"run_mha_fwd_hdim\d+", "DROPOUT_SWITCH", "params.p_dropout < 1.f", "Is_dropout")
BWD = Axis("flash_bwd_launch_template.h", r"run_mha_bwd_hdim\d+", "DROPOUT_SWITCH", "params.p_dropout < 1.f", "Is_dropout")
# Measured on the head-dim-128 split-kv unit: this switch halves it evenly (161 s / 159 s on two
# cores, from 264 s); the append-KV one does not (129 s / 198 s).
SPLIT = Axis("flash_fwd_launch_template.h", r"run_flash_splitkv_fwd", "BOOL_SWITCH", "params.num_splits > 1", "Split")

UNIT = re.compile(r"^flash_(?P<kind>fwd_split|fwd|bwd)_hdim\d+_(?:fp16|bf16)(?:_causal)?_sm\d+$")
AXES = {"fwd": FWD, "bwd": BWD, "fwd_split": SPLIT}


def fail(what: str) -> SystemExit:
    return SystemExit(f"error: shard_units: {what}; the unit split does not fit this flash-attn version "
                      "(build without EXTFORGE_SHARD_UNITS)")


def add_shard_parameter(header: str, axis: Axis) -> str:
    """`template<...>\\nvoid F(` gets `, int Shard = -1`, and F's switch on axis.const becomes a
    FLASH_SHARD_SWITCH. Every match of axis.function must have exactly that switch."""
    head = re.compile(r"template<(?P<params>[^<>]*)>\s*\nvoid (?P<name>" + axis.function + r")\((?P<args>[^)]*)\) \{")
    switch = f"{axis.switch}({axis.cond}, {axis.const}, [&] {{"
    out, pos, count = [], 0, 0
    for m in head.finditer(header):
        end = header.find("\n}\n", m.end())
        body = header[m.end():end]
        if body.count(switch) != 1:
            raise fail(f"{m['name']} in {axis.header} has {body.count(switch)} `{switch}`, expected 1")
        out += [header[pos:m.start()],
                f"template<{m['params']}, int Shard = -1>\nvoid {m['name']}({m['args']}) {{",
                body.replace(switch, f"FLASH_SHARD_SWITCH(Shard, {axis.switch}, {axis.cond}, {axis.const}, [&] {{")]
        pos, count = end, count + 1
    if not count:
        raise fail(f"no `void {axis.function}(` template in {axis.header}")
    return "".join(out) + header[pos:]


def split_dispatch_through(header: str) -> str:
    """run_mha_fwd_splitkv_dispatch is declared in flash.h with three template parameters, so it
    cannot take a fourth: its body moves to run_mha_fwd_splitkv_dispatch_shard<..., Shard>, and
    the declared one forwards to that with Shard -1."""
    head = "template<typename T, int Headdim, bool Is_causal>\nvoid run_mha_fwd_splitkv_dispatch(Flash_fwd_params &params, cudaStream_t stream) {"
    call = "Is_causal>(params, stream);\n}"
    start = header.find(head)
    end = header.find(call, start)
    if start < 0 or end < 0:
        raise fail("run_mha_fwd_splitkv_dispatch is not of the expected shape")
    body = header[start + len(head):end]
    return (header[:start]
            + "template<typename T, int Headdim, bool Is_causal, int Shard>\n"
              "void run_mha_fwd_splitkv_dispatch_shard(Flash_fwd_params &params, cudaStream_t stream) {"
            + body + "Is_causal, Shard>(params, stream);\n}\n\n"
            + head + "\n    run_mha_fwd_splitkv_dispatch_shard<T, Headdim, Is_causal, -1>(params, stream);\n}"
            + header[end + len(call):])


def patch_headers(src: Path, kinds: set[str]) -> None:
    """Give the launch templates of these unit kinds their Shard parameter (once per build)."""
    switch_h = src / "static_switch.h"
    if "FLASH_SHARD_SWITCH" not in switch_h.read_text():
        switch_h.write_text(switch_h.read_text() + SHARD_SWITCH)
    for kind in sorted(kinds):
        axis = AXES[kind]
        path = src / axis.header
        text = add_shard_parameter(path.read_text(), axis)
        if kind == "fwd_split":
            text = split_dispatch_through(text)
        path.write_text(text)


# The entry point each kind of unit defines: a specialization that calls run_mha_{fwd,bwd}_hdimD,
# or (split-kv) an explicit instantiation of run_mha_fwd_splitkv_dispatch.
_CALL = re.compile(r"(?P<callee>run_mha_(?:fwd|bwd)_hdim\d+)<(?P<targs>[^<>]+)>\(params, stream\);")
_SPLIT = re.compile(r"template void run_mha_fwd_splitkv_dispatch<(?P<targs>[^<>]+)>\(Flash_fwd_params &params, cudaStream_t stream\);")


def split_unit(unit_text: str, kind: str) -> tuple[str, str]:
    """(the unit's new text, its `_shard1` twin's text)."""
    axis = AXES[kind]
    params = "Flash_bwd_params" if kind == "bwd" else "Flash_fwd_params"
    if kind == "fwd_split":
        m = _SPLIT.search(unit_text)
        if not m:
            raise fail("a split-kv unit without `template void run_mha_fwd_splitkv_dispatch<...>`")
        callee, targs = "run_mha_fwd_splitkv_dispatch_shard", m["targs"]
        body = (f"template<>\nvoid run_mha_fwd_splitkv_dispatch<{targs}>(Flash_fwd_params &params, cudaStream_t stream) {{\n"
                f"    {_pick(axis, callee, targs)}\n}}")
    else:
        m = _CALL.search(unit_text)
        if not m:
            raise fail(f"a {kind} unit without a `run_mha_{kind}_hdimD<...>(params, stream);` call")
        callee, targs = m["callee"], m["targs"]
        body = _pick(axis, callee, targs)
    side1 = f"void {callee}<{targs}, 1>({params} &params, cudaStream_t stream);"
    namespace = "namespace FLASH_NAMESPACE {\n"
    if namespace not in unit_text:
        raise fail("a kernel unit without `namespace FLASH_NAMESPACE {`")
    unit = unit_text.replace(m.group(0), body, 1).replace(
        namespace, f"{namespace}\n// extforge: side 1 of this unit's switch compiles in its {SUFFIX} twin.\n"
                   f"extern template {side1}\n", 1)
    header = '#include "flash_bwd_launch_template.h"' if kind == "bwd" else '#include "flash_fwd_launch_template.h"'
    twin = (f"// extforge: side 1 ({axis.const}) of a split flash-attn unit (shard_units.py).\n"
            f'#include "namespace_config.h"\n{header}\n\n{namespace}\ntemplate {side1}\n\n}} // namespace FLASH_NAMESPACE\n')
    return unit, twin


def _pick(axis: Axis, callee: str, targs: str) -> str:
    return (f"if ({axis.cond}) {{ {callee}<{targs}, 1>(params, stream); }} "
            f"else {{ {callee}<{targs}, 0>(params, stream); }}")


def shard(src: Path, units: list[str]) -> list[str]:
    """Split these units (stems in src) and return the stems of their new twins."""
    kinds = {}
    for stem in units:
        m = UNIT.match(stem)
        if not m:
            raise fail(f"{stem} is not a flash-attn kernel unit (flash_{{fwd,bwd,fwd_split}}_hdimD_...)")
        kinds[stem] = m["kind"]
    patch_headers(src, set(kinds.values()))
    twins = []
    for stem, kind in kinds.items():
        unit, twin = split_unit((src / f"{stem}.cu").read_text(), kind)
        (src / f"{stem}.cu").write_text(unit)
        (src / f"{stem}{SUFFIX}.cu").write_text(twin)
        twins.append(stem + SUFFIX)
    return twins
