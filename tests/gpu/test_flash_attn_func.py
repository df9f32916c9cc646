"""flash_attn_func and flash_attn_varlen_func against float64 PyTorch references, forward and backward."""

from __future__ import annotations

import functools

import pytest
from gpu_env import import_or_skip, require_head_dim

torch = import_or_skip("torch")
flash_attn = import_or_skip("flash_attn")

from attention_ref import attention, compare_with_reference  # noqa: E402

DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
CAUSAL = [pytest.param(False, id="full"), pytest.param(True, id="causal")]
HEAD_DIMS = [64, 128]
# (batch, seqlen_q, seqlen_k, heads, kv_heads): lengths that are no multiple of the kernels'
# 64/128 tiles, seqlen_q < seqlen_k, and seqlen_q > seqlen_k, where a causal mask hides every key
# from the first queries (flash-attn returns zeros there); the second shape is grouped-query.
SHAPES = [
    pytest.param((2, 113, 203, 4, 4), id="q113-k203"),
    pytest.param((2, 517, 259, 6, 2), id="q517-k259-gqa"),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_func_matches_reference(device, seed, dtype, causal, headdim, shape):
    require_head_dim(headdim)
    batch, seqlen_q, seqlen_k, heads, kv_heads = shape
    q = torch.randn(batch, seqlen_q, heads, headdim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, headdim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, headdim, device=device, dtype=dtype)
    compare_with_reference(
        functools.partial(flash_attn.flash_attn_func, causal=causal),
        functools.partial(attention, causal=causal),
        (q, k, v),
        seed=seed,
        what=f"flash_attn_func {dtype} causal={causal} d={headdim} shape={shape}",
    )


def _per_sequence(q, k, v, *, cu_q: list[int], cu_k: list[int], causal: bool):
    """Reference for packed (total, heads, dim) tensors: each sequence attended on its own."""
    outs = [
        attention(q[None, qa:qb], k[None, ka:kb], v[None, ka:kb], causal=causal)[0]
        for qa, qb, ka, kb in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])
    ]
    return torch.cat(outs)


def _offsets(lengths: list[int]) -> list[int]:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return offsets


# Query and key lengths per packed sequence: a single token, q shorter than k, equal lengths on a
# tile boundary, q longer than k (hidden causal rows), and lengths spanning several tiles.
VARLEN_Q = [1, 77, 128, 300, 511]
VARLEN_K = [1, 150, 128, 257, 384]


@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_varlen_func_matches_per_sequence_reference(device, seed, dtype, causal, headdim):
    require_head_dim(headdim)
    heads, kv_heads = 4, 2
    cu_q, cu_k = _offsets(VARLEN_Q), _offsets(VARLEN_K)
    q = torch.randn(cu_q[-1], heads, headdim, device=device, dtype=dtype)
    k = torch.randn(cu_k[-1], kv_heads, headdim, device=device, dtype=dtype)
    v = torch.randn(cu_k[-1], kv_heads, headdim, device=device, dtype=dtype)
    kernel = functools.partial(
        flash_attn.flash_attn_varlen_func,
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
        max_seqlen_q=max(VARLEN_Q),
        max_seqlen_k=max(VARLEN_K),
        causal=causal,
    )
    compare_with_reference(
        kernel,
        functools.partial(_per_sequence, cu_q=cu_q, cu_k=cu_k, causal=causal),
        (q, k, v),
        seed=seed,
        what=f"flash_attn_varlen_func {dtype} causal={causal} d={headdim} q={VARLEN_Q} k={VARLEN_K}",
    )
