"""Prepare upstream's FlashAttention-3 tree (hopper/) for an offline, pinned, subset build.

    python prepare_sources.py SRC_DIR --env-out FILE [--record-out FILE]

SRC_DIR holds hopper/ (flash-attention at the pinned commit) and csrc/cutlass/include/ (the
cutlass submodule's headers). Reads the variant from FA3_HEAD_DIMS, FA3_DTYPES, FA3_FEATURES
(each "all", or a ";"-list) and EXTFORGE_CXX_STD (the C++ standard the host torch needs), then:

1. proves the unpacked trees are upstream's own: their git tree ids must equal the ones the
   recipe pins (the archives' sha256 prove the bytes; the tree id ties them to the commit);
2. edits hopper/setup.py so it never touches the network or git (a CUDA 12.x toolkit makes it
   download nvcc/ptxas from NVIDIA; `git submodule update` runs on every build) and compiles
   with the C++ standard the host torch needs, hopper/flash_api_stable.cpp so a subset
   without the different-V-head-dim kernels refuses such a call instead of computing garbage,
   and hopper/flash_fwd_combine_kernel.h so `flash_attn_combine` of one split combines it
   instead of returning uninitialised memory — each edit must find its anchor, or the build
   stops here naming it, before any compile;
3. writes FILE: the FLASH_ATTENTION_DISABLE_* switches of the subset as shell `export` lines;
4. writes the subset into --record-out (JSON), so the package says what it holds.

Standard library only: it runs with the build env's python before anything is compiled.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import stat
import sys
from pathlib import Path

# Pinned upstream trees: `git rev-parse <commit>:<folder>` of the commits named in the recipe.
TREE_IDS = {
    "hopper": "3e3af0e612ac050cf70f8fa1c73f8b97877ec2a6",
    "csrc/cutlass/include": "3c43ce5aa9a960e8ea26cdf485a121048d09d3ee",
}

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
    "sm80": ("SM80",),
}
# The stable-ABI floor the recipe promises (run: pytorch >=2.9); upstream sets it in setup.py.
STABLE_TARGET = "0x0209000000000000"


class PrepareError(Exception):
    """What is wrong and how to fix it; printed as one block, the build stops before compiling."""


# ------------------------------------------------------------------ the variant (pure)

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
            raise PrepareError(f"fa3_head_dims={head_dims!r}: FlashAttention-3 builds head dims "
                               f"{', '.join(map(str, HEAD_DIMS))}; write e.g. \"128\" or \"64;128\", or \"all\"")
    if dtypes.strip() in ("", "all"):
        types = list(DTYPES)
    else:
        types = _items(dtypes)
        unknown = [t for t in types if t not in DTYPES]
        if unknown or "bf16" not in types:
            raise PrepareError(f"fa3_dtypes={dtypes!r}: a list of {', '.join(DTYPES)} that includes bf16 "
                               "(upstream always builds bf16), or \"all\"")
        types = [t for t in DTYPES if t in types]
    if features.strip() in ("", "all"):
        feats = list(FEATURES)
    elif features.strip() == "none":
        feats = []
    else:
        feats = _items(features)
        unknown = [f for f in feats if f not in FEATURES]
        if unknown:
            raise PrepareError(f"fa3_features={features!r}: unknown {', '.join(unknown)}; "
                               f"known: {', '.join(FEATURES)} (or \"all\", \"none\")")
        feats = [f for f in FEATURES if f in feats]
    return {"head_dims": dims, "dtypes": types, "features": feats}


def disable_switches(subset: dict[str, list]) -> list[str]:
    """Upstream's FLASH_ATTENTION_DISABLE_* variables that this subset turns on."""
    off = [f"HDIM{d}" for d in HEAD_DIMS if d not in subset["head_dims"]]
    off += [s for t, switches in DTYPES.items() if t not in subset["dtypes"] for s in switches]
    off += [s for f, switches in FEATURES.items() if f not in subset["features"] for s in switches]
    # Kernels for a value dim unlike the head dim (64 with 256/512, 192 with 128) are reached only
    # through their head dim's dispatch: without it they would be compiled and never called.
    for dim in (64, 192):
        if f"HDIMDIFF{dim}" not in off and dim not in subset["head_dims"]:
            off.append(f"HDIMDIFF{dim}")
    return [f"FLASH_ATTENTION_DISABLE_{s}" for s in off]


# ------------------------------------------------------------------ setup.py edits (pure)

# (why, anchor regex, replacement); each anchor must match exactly once.
def setup_edits(cxx_std: str) -> list[tuple[str, str, str]]:
    return [
        ("never run git: the cutlass headers come from the pinned archive",
         r'\n(\s*)subprocess\.run\(\["git", "submodule", "update", "--init", "\.\./csrc/cutlass"\]\)',
         r"\n\1pass  # extforge: cutlass comes from the pinned archive"),
        ("never download nvcc/ptxas: the channel's CUDA toolkit compiles",
         r"\n(\s*)if bare_metal_version >= Version\(\"12\.3\"\) and bare_metal_version < Version\(\"13\.0\"\)"
         r" and bare_metal_version != Version\(\"12\.8\"\):",
         r"\n\1if False:  # extforge: the channel's toolkit, never a download"),
        ("compile with the C++ standard the host torch's headers need (nvcc)",
         r'\n(\s*)"-std=c\+\+17",', rf'\n\1"-std={cxx_std}",'),
        ("compile with the C++ standard the host torch's headers need (host compiler)",
         r'"cxx": \["-O3", "-std=c\+\+17",', rf'"cxx": ["-O3", "-std={cxx_std}",'),
        ("the stable-ABI floor is the one the recipe's run requirement promises",
         rf'"-DTORCH_TARGET_VERSION={STABLE_TARGET}"', rf'"-DTORCH_TARGET_VERSION={STABLE_TARGET}"'),
    ]


# A subset without the kernels for a V head dim other than Q/K's (hdimdiff) runs upstream's
# dispatch past them onto the kernel of equal dims: a wrong result, no error (seen on an H200:
# Q/K 64 with V 256 off by up to 1.0, V 512 NaN). These checks make such a call fail as upstream's
# other disabled features do. Inserted after the check every different-V call passes.
_DIFFERENT_V = r'(\n(\s*)STD_TORCH_CHECK\(dprops->major == 9, "Only Hopper supports different V headdim"\);)'
API_EDITS = [
    ("refuse a different V head dim at Q/K <= 64 when hdimdiff is not built", _DIFFERENT_V,
     r'\1\n\2#ifdef FLASHATTENTION_DISABLE_HDIMDIFF64\n\2STD_TORCH_CHECK(head_size > 64, "This flash attention build '
     r'does not support a V head dim different from a Q/K head dim <= 64 (built without fa3_features hdimdiff)");'
     r'\n\2#endif'),
    ("refuse a different V head dim at Q/K in (128, 192] when hdimdiff is not built", _DIFFERENT_V,
     r'\1\n\2#ifdef FLASHATTENTION_DISABLE_HDIMDIFF192\n\2STD_TORCH_CHECK(head_size <= 128 || head_size > 192, "This flash '
     r'attention build does not support a V head dim different from a Q/K head dim in (128, 192] (built without '
     r'fa3_features hdimdiff)");\n\2#endif'),
]

# The combine kernel returns at once where a row has one split: right for the forward pass (whose
# dynamic split count of 1 means the attention kernel wrote the output itself; it calls combine
# only with more than one split), wrong for `flash_attn_combine` called with one split, whose
# output and LSE are then the uninitialised memory `new_empty` gave (seen on an H200: upstream's
# test_flash_attn_combine failed every fp16 case with one split; fp32 and bf16 passed only where
# the allocator handed back a previous case's result). The kernel's general path combines one
# split exactly (scale exp(0) = 1, rows of -inf to 0), so only a dynamic count returns early.
COMBINE_EDITS = [
    ("combine one static split instead of returning uninitialised memory",
     r"\n(\s*)if \(num_splits <= 1\) \{ return; \}",
     r"\n\1if (params.num_splits_dynamic_ptr && num_splits <= 1) { return; }  // extforge: see prepare_sources.py"),
]


def apply_edits(name: str, text: str, edits: list[tuple[str, str, str]]) -> str:
    for why, anchor, replacement in edits:
        text, n = re.subn(anchor, replacement, text)
        if n != 1:
            raise PrepareError(f"hopper/{name}: expected one match of {anchor!r} ({why}), found {n}; "
                               "the source is not the upstream commit this recipe was written for — "
                               "update prepare_sources.py's edits together with the recipe's sources")
    return text


def edit_setup(text: str, cxx_std: str) -> str:
    return apply_edits("setup.py", text, setup_edits(cxx_std))


# ------------------------------------------------------------------ git tree ids

def git_tree_id(folder: Path) -> str:
    """The id `git write-tree` gives this folder (files, executables, symlinks; no empty dirs)."""
    entries = []
    for child in folder.iterdir():
        st = child.lstat()
        if stat.S_ISLNK(st.st_mode):
            mode, oid = b"120000", _blob_id(os.readlink(child).encode())
        elif stat.S_ISDIR(st.st_mode):
            if not any(child.iterdir()):
                continue
            mode, oid = b"40000", git_tree_id(child)
        else:
            mode = b"100755" if st.st_mode & stat.S_IXUSR else b"100644"
            oid = _blob_id(child.read_bytes())
        # git sorts trees as if their name ended in "/".
        key = child.name.encode() + (b"/" if mode == b"40000" else b"")
        entries.append((key, mode + b" " + child.name.encode() + b"\0" + bytes.fromhex(oid)))
    body = b"".join(e for _, e in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_trees(src: Path) -> None:
    for rel, want in TREE_IDS.items():
        folder = src / rel
        if not folder.is_dir():
            raise PrepareError(f"{folder} is missing: the recipe's sources did not unpack where expected")
        got = git_tree_id(folder)
        if got != want:
            raise PrepareError(f"{rel}: git tree {got}, the recipe pins {want}; the unpacked source is not "
                               "upstream's tree at the pinned commit (a patched or re-made archive?)")


# ------------------------------------------------------------------ main

def prepare(src: Path, env_out: Path, record_out: Path | None) -> dict:
    check_trees(src)
    subset = parse_subset(os.environ.get("FA3_HEAD_DIMS", "all"), os.environ.get("FA3_DTYPES", "all"),
                          os.environ.get("FA3_FEATURES", "all"))
    cxx_std = os.environ.get("EXTFORGE_CXX_STD") or "c++17"
    setup = src / "hopper" / "setup.py"
    setup.write_text(edit_setup(setup.read_text(), cxx_std))
    for name, edits in (("flash_api_stable.cpp", API_EDITS), ("flash_fwd_combine_kernel.h", COMBINE_EDITS)):
        path = src / "hopper" / name
        path.write_text(apply_edits(name, path.read_text(), edits))
    # setup.py reads the repository's README as its long description.
    readme = src / "README.md"
    if not readme.exists():
        readme.write_text("FlashAttention-3 (hopper/ of Dao-AILab/flash-attention), built by extforge.\n")
    switches = disable_switches(subset)
    env_out.write_text("".join(f"export {s}=TRUE\n" for s in switches)
                       + f"export FA3_DISABLED={shlex.quote(' '.join(switches))}\n")
    record = {**subset, "disabled": switches, "cxx_std": cxx_std}
    if record_out is not None:
        record_out.write_text(json.dumps(record, indent=2, sort_keys=True))
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--env-out", type=Path, required=True)
    ap.add_argument("--record-out", type=Path)
    args = ap.parse_args(argv)
    try:
        record = prepare(args.src, args.env_out, args.record_out)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("flash-attn-3 subset:", json.dumps(record, sort_keys=True), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
