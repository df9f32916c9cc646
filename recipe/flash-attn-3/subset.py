"""FlashAttention-3's kernel subset as upstream's switches, in the build (build.sh):

    python subset.py

Reads the variant's subset from FA3_HEAD_DIMS, FA3_DTYPES, FA3_FEATURES (each "all", or a
";"-list) and its GPU archs from EXTFORGE_ARCH_NAMES (extforge-torch-build's, from cuda_archs:
sm_90a builds the Hopper kernels, sm_80 beside it upstream's A100 code path), prints upstream's
FLASH_ATTENTION_DISABLE_* switches as shell `export` lines, and adds the subset to the build
record (EXTFORGE_RECORD_EXTRA). A value it does not know stops the build here, before any compile.

Standard library only: it runs with the host env's python before anything is compiled.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

HEAD_DIMS = (64, 96, 128, 192, 256)
# bf16 is always built: upstream has no switch for it.
DTYPES = {"bf16": (), "fp16": ("FP16",), "fp8": ("FP8",)}
# Optional kernel families, our names -> upstream's FLASH_ATTENTION_DISABLE_<X> switches.
FEATURES = {
    "bwd": ("BACKWARD",),
    "varlen": ("VARLEN",),
    "split": ("SPLIT",),
    "paged": ("PAGEDKV",),
    "appendkv": ("APPENDKV",),
    "local": ("LOCAL",),
    "softcap": ("SOFTCAP",),
    "packgqa": ("PACKGQA",),
    "cluster": ("CLUSTER",),
    "hdimdiff": ("HDIMDIFF64", "HDIMDIFF192"),
}


class SubsetError(Exception):
    """What is wrong and how to fix it; printed as one line, the build stops before compiling."""


def _items(value: str) -> list[str]:
    return [v.strip() for v in value.split(";") if v.strip()]


def parse_subset(head_dims: str, dtypes: str, features: str) -> dict[str, list]:
    """The variant's kernel subset, validated: {"head_dims": [...], "dtypes": [...], "features": [...]}."""
    if head_dims.strip() in ("", "all"):
        dims = list(HEAD_DIMS)
    else:
        try:
            dims = sorted({int(d) for d in _items(head_dims)})
        except ValueError:
            dims = []
        if not dims or any(d not in HEAD_DIMS for d in dims):
            raise SubsetError(f"fa3_head_dims={head_dims!r}: FlashAttention-3 builds head dims "
                              f"{', '.join(map(str, HEAD_DIMS))}; write e.g. \"128\" or \"64;128\", or \"all\"")
    if dtypes.strip() in ("", "all"):
        types = list(DTYPES)
    else:
        types = _items(dtypes)
        unknown = [t for t in types if t not in DTYPES]
        if unknown or "bf16" not in types:
            raise SubsetError(f"fa3_dtypes={dtypes!r}: a list of {', '.join(DTYPES)} that includes bf16 "
                              "(upstream always builds bf16), or \"all\"")
        types = [t for t in DTYPES if t in types]
    if features.strip() in ("", "all"):
        feats = list(FEATURES)
    elif features.strip() == "none":
        feats = []
    else:
        feats = _items(features)
        if "sm80" in feats:
            raise SubsetError(f"fa3_features={features!r}: upstream's A100 code path is an arch, not a feature: "
                              "name 8.0 beside 9.0a in cuda_archs (e.g. --variant \"cuda_archs=8.0;9.0a\")")
        unknown = [f for f in feats if f not in FEATURES]
        if unknown:
            raise SubsetError(f"fa3_features={features!r}: unknown {', '.join(unknown)}; "
                              f"known: {', '.join(FEATURES)} (or \"all\", \"none\")")
        feats = [f for f in FEATURES if f in feats]
    return {"head_dims": dims, "dtypes": types, "features": feats}


def check_archs(names: str) -> bool:
    """Whether the variant's archs (EXTFORGE_ARCH_NAMES, "sm_80,sm_90a") build upstream's A100
    code path; they must name sm_90a, which every Hopper kernel is written for."""
    archs = set(filter(None, names.split(",")))
    if "sm_90a" not in archs:
        raise SubsetError(f"the variant's archs are {names or 'none'}: FlashAttention-3's Hopper kernels are written "
                          "for sm_90a; name 9.0a in cuda_archs (with 8.0 for upstream's A100 code path)")
    return "sm_80" in archs


def disable_switches(subset: dict[str, list], sm80: bool) -> list[str]:
    """Upstream's FLASH_ATTENTION_DISABLE_* variables that this subset turns on (`sm80`: the
    variant's archs build the A100 code path)."""
    off = [f"HDIM{d}" for d in HEAD_DIMS if d not in subset["head_dims"]]
    off += [s for t, switches in DTYPES.items() if t not in subset["dtypes"] for s in switches]
    off += [s for f, switches in FEATURES.items() if f not in subset["features"] for s in switches]
    # Kernels for a value dim unlike the head dim (64 with 256/512, 192 with 128) are reached only
    # through their head dim's dispatch: without it they would be compiled and never called.
    for dim in (64, 192):
        if f"HDIMDIFF{dim}" not in off and dim not in subset["head_dims"]:
            off.append(f"HDIMDIFF{dim}")
    if not sm80:
        off.append("SM80")
    return [f"FLASH_ATTENTION_DISABLE_{s}" for s in off]


def main() -> int:
    env = os.environ
    try:
        sm80 = check_archs(env.get("EXTFORGE_ARCH_NAMES", ""))
        subset = parse_subset(env.get("FA3_HEAD_DIMS", "all"), env.get("FA3_DTYPES", "all"), env.get("FA3_FEATURES", "all"))
    except SubsetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    switches = disable_switches(subset, sm80)
    print("".join(f"export {s}=TRUE\n" for s in switches), end="")
    record = {"subset": {**subset, "disabled": switches}, "stable_abi_floor": "2.9"}
    with open(env["EXTFORGE_RECORD_EXTRA"], "w") as fh:
        json.dump(record, fh)
    print(f"flash-attn-3 subset: {json.dumps(record['subset'], sort_keys=True)}; disabled: "
          f"{shlex.join(switches) or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
