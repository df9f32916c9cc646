"""FlashAttention-3 (the flash-attn-3 package, `flash_attn_interface`) against a float64 reference.

Reads the kernel subset the package was built with from its build record (share/extforge/build/
flash-attn-3.json), so a slim build is tested on what it holds, and what it left out must fail
with upstream's clear error, never a silent result. FA3 runs on Hopper only (sm_90a kernels).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
from gpu_env import import_or_skip, unavailable

torch = import_or_skip("torch")
fa3 = import_or_skip("flash_attn_interface")

from attention_ref import attention, compare_forward, compare_with_reference  # noqa: E402

RECORD = Path(sys.prefix) / "share" / "extforge" / "build" / "flash-attn-3.json"
SUBSET = json.loads(RECORD.read_text())["subset"] if RECORD.is_file() else {
    "head_dims": [64, 96, 128, 192, 256], "dtypes": ["bf16", "fp16", "fp8"], "features": ["bwd", "varlen"]}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BUILT_DTYPES = [d for d in SUBSET["dtypes"] if d in DTYPES]
MAX_DIM = max(SUBSET["head_dims"])
# The head dim the checks that are not about head dims use: 128 where built, else the largest built.
DIM = 128 if 128 in SUBSET["head_dims"] else MAX_DIM


@pytest.fixture
def hopper(device):
    if torch.cuda.get_device_capability(device)[0] != 9:
        unavailable(f"FlashAttention-3 kernels are sm_90a; this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability(device)))}")
    return device


def _qkv(device, dtype, headdim: int, seqlen_q: int = 173, seqlen_k: int = 173, heads: int = 4, kv_heads: int = 4):
    return [torch.randn(2, seqlen_q, heads, headdim, device=device, dtype=dtype),
            torch.randn(2, seqlen_k, kv_heads, headdim, device=device, dtype=dtype),
            torch.randn(2, seqlen_k, kv_heads, headdim, device=device, dtype=dtype)]


@pytest.mark.parametrize("dtype", BUILT_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(173, 173, 4, 4), (128, 397, 8, 2), (1, 240, 4, 1)], ids=["square", "gqa", "decode-mqa"])
def test_matches_reference(hopper, seed, dtype: str, causal: bool, shape) -> None:
    sq, sk, h, hk = shape
    inputs = _qkv(hopper, DTYPES[dtype], MAX_DIM if MAX_DIM <= 128 else 128, sq, sk, h, hk)
    what = f"flash_attn_3 {dtype} causal={causal} q={sq} k={sk} heads={h}/{hk}"
    kernel = functools.partial(fa3.flash_attn_func, causal=causal)
    reference = functools.partial(attention, causal=causal)
    if "bwd" in SUBSET["features"]:
        compare_with_reference(kernel, reference, inputs, seed=seed, what=what)
    else:
        compare_forward(kernel(*inputs), reference, inputs, seed=seed, what=what)


def test_smaller_head_dim_runs_on_the_next_built_kernel(hopper, seed) -> None:
    """Upstream rounds a head dim up to the next one built (64 runs on the 128 kernels)."""
    dim = min(SUBSET["head_dims"]) // 2
    inputs = _qkv(hopper, torch.bfloat16, dim)
    compare_forward(fa3.flash_attn_func(*inputs, causal=True), functools.partial(attention, causal=True), inputs,
                    seed=seed, what=f"flash_attn_3 bf16 head dim {dim}")


@pytest.mark.skipif("varlen" not in SUBSET["features"], reason="built without the varlen kernels")
def test_varlen_matches_padded_batches(hopper, seed) -> None:
    """Sequences of unequal length packed together (what transformers sends for padded batches)."""
    lengths = [37, 211, 128]
    seqs = [_qkv(hopper, torch.bfloat16, DIM, n, n) for n in lengths]
    packed = [torch.cat([s[i][0] for s in seqs]) for i in range(3)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=hopper, dtype=torch.int32)
    out = fa3.flash_attn_varlen_func(*packed, cu, cu, max(lengths), max(lengths), causal=True)
    for n, start, s in zip(lengths, cu.tolist(), seqs, strict=False):
        q, k, v = (x[:1] for x in s)
        compare_forward(out[start:start + n][None], functools.partial(attention, causal=True), [q, k, v],
                        seed=seed, what=f"flash_attn_3 varlen, sequence of {n}")


@pytest.mark.skipif(64 not in SUBSET["head_dims"], reason="head dim 64 is not built")
def test_a_v_head_dim_other_than_qks_is_computed_or_refused(hopper, seed) -> None:
    """Q/K head dim 64 with V 256: the hdimdiff kernels where they are built, else the recipe's
    clear error (upstream's dispatch would run the 64x64 kernel and return a wrong result)."""
    q, k, _ = _qkv(hopper, torch.bfloat16, 64)
    v = torch.randn(2, 173, 4, 256, device=hopper, dtype=torch.bfloat16)
    if "hdimdiff" in SUBSET["features"]:
        compare_forward(fa3.flash_attn_func(q, k, v), functools.partial(attention, causal=False), [q, k, v], seed=seed,
                        what="flash_attn_3 Q/K 64, V 256")
    else:
        with pytest.raises(RuntimeError, match="does not support a V head dim different"):
            fa3.flash_attn_func(q, k, v)


@pytest.mark.skipif("split" not in SUBSET["features"], reason="split-KV (combine) is not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_combine_of_one_split_is_that_split(hopper, dtype) -> None:
    """`flash_attn_combine` of a single split returns it (rows whose LSE is -inf as 0), computed,
    not the uninitialised memory upstream's kernel left there: the allocator is first handed
    blocks full of NaN, which an early return would give back."""
    splits, batch, seqlen, heads, d = 1, 3, 97, 4, 128
    for _ in range(4):
        torch.full((splits * batch * seqlen * heads * d,), float("nan"), device=hopper)
    torch.cuda.synchronize(hopper)
    out_partial = torch.randn(splits, batch, seqlen, heads, d, device=hopper)
    lse_partial = torch.randn(splits, batch, heads, seqlen, device=hopper).transpose(-1, -2)
    lse_partial[:, 0] = -float("inf")
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)
    want = out_partial[0].clone()
    want[0] = 0
    assert torch.equal(out, want.to(dtype)), f"max error {(out.float() - want).abs().max().item()}"
    assert torch.equal(lse, lse_partial[0])


@pytest.mark.skipif(MAX_DIM >= 256, reason="every head dim is built")
def test_head_dim_above_the_build_is_a_clear_error(hopper) -> None:
    with pytest.raises(RuntimeError, match=f"head dimension at most {MAX_DIM}"):
        fa3.flash_attn_func(*_qkv(hopper, torch.bfloat16, 256))


@pytest.mark.skipif("fp16" in SUBSET["dtypes"], reason="fp16 is built")
def test_unbuilt_dtype_is_a_clear_error(hopper) -> None:
    with pytest.raises(RuntimeError, match="does not support FP16"):
        fa3.flash_attn_func(*_qkv(hopper, torch.float16, DIM))


def test_build_record_matches_upstreams_config() -> None:
    import flash_attn_config

    if not RECORD.is_file():
        pytest.skip("not installed from our package (no build record)")
    flags = flash_attn_config.CONFIG["build_flags"]
    recorded = {s.removeprefix("FLASH_ATTENTION_DISABLE_") for s in json.loads(RECORD.read_text())["subset"]["disabled"]}
    built_off = {k.split("DISABLE_", 1)[1].replace("SM8x", "SM80") for k, v in flags.items() if v and "DISABLE_" in k}
    assert built_off == recorded
