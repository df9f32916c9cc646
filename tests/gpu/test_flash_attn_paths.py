"""The kernel paths besides plain attention: dropout (forward and backward) and the kv-cache
(split-kv kernels, with and without appended keys, one split or several).

A build whose longest units are split in two translation units (recipe/flash-attn/shard_units.py)
compiles exactly these paths in the second unit: the dropout kernels of the forward and backward
units, the several-splits kernels of the split-kv units. A kernel registered in the wrong unit,
or not at all, would fail here on the GPU, not at import.
"""

from __future__ import annotations

import functools

import pytest
from gpu_env import import_or_skip, require_head_dim

torch = import_or_skip("torch")
flash_attn = import_or_skip("flash_attn")

from attention_ref import attention, compare_forward, compare_with_reference, rel_error  # noqa: E402

DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
CAUSAL = [pytest.param(False, id="full"), pytest.param(True, id="causal")]
HEAD_DIMS = [64, 128]
DROPOUT_P = 0.17


@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_matches_reference_with_the_kernels_mask(device, seed, dtype, causal, headdim):
    """With return_attn_probs the kernel also returns which probabilities it dropped (negative
    entries); the reference applies that mask, forward and backward."""
    require_head_dim(headdim)
    batch, seqlen_q, seqlen_k, heads = 2, 197, 211, 4
    q, k, v = (torch.randn(batch, n, heads, headdim, device=device, dtype=dtype) for n in (seqlen_q, seqlen_k, seqlen_k))
    seen: dict[str, torch.Tensor] = {}

    def kernel(q, k, v):
        out, _lse, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=DROPOUT_P, causal=causal,
                                                        return_attn_probs=True)
        seen["keep"] = s_dmask[:, :, :seqlen_q, :seqlen_k] >= 0
        return out

    def reference(q, k, v):
        return attention(q, k, v, causal=causal, keep=seen["keep"], dropout_p=DROPOUT_P)

    compare_with_reference(kernel, reference, (q, k, v), seed=seed,
                           what=f"flash_attn_func dropout={DROPOUT_P} {dtype} causal={causal} d={headdim}")
    # Positions a causal mask hides are never written (the blocks are skipped): count the rest.
    rows, cols = torch.arange(seqlen_q, device=device)[:, None], torch.arange(seqlen_k, device=device)[None, :]
    visible = (cols <= rows + (seqlen_k - seqlen_q)) if causal else torch.ones_like(cols > rows)
    dropped = 1.0 - seen["keep"][:, :, visible].float().mean().item()
    assert abs(dropped - DROPOUT_P) < 0.02, f"the kernel dropped {dropped:.3f} of the probabilities, asked {DROPOUT_P}"

    # The kernel without return_attn_probs (a separate instantiation) draws the same mask from
    # the same generator state; another mask would change the output by tens of percent.
    torch.manual_seed(seed)
    with_probs = flash_attn.flash_attn_func(q, k, v, dropout_p=DROPOUT_P, causal=causal, return_attn_probs=True)[0]
    torch.manual_seed(seed)
    plain = flash_attn.flash_attn_func(q, k, v, dropout_p=DROPOUT_P, causal=causal)
    assert rel_error(plain, with_probs) < 2e-2, (
        f"dropout without return_attn_probs differs from the same call with it: {rel_error(plain, with_probs):.2e}")


@pytest.mark.parametrize("num_splits", [1, 4], ids=["one-split", "four-splits"])
@pytest.mark.parametrize("append", [False, True], ids=["cache-only", "append-kv"])
@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_matches_reference(device, seed, dtype, headdim, append, num_splits):
    """Decoding against a kv-cache: each sequence attends (causally, bottom-right) to its cached
    keys plus, with append-kv, the new keys that the kernel writes into the cache."""
    require_head_dim(headdim)
    batch, cache_len, new, heads, kv_heads = 3, 300, 5, 8, 2
    cached = [17, 150, 251]
    shape = (batch, cache_len, kv_heads, headdim)
    k_cache, v_cache = torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype)
    k_new, v_new = (torch.randn(batch, new, kv_heads, headdim, device=device, dtype=dtype) for _ in range(2))
    q = torch.randn(batch, new, heads, headdim, device=device, dtype=dtype)
    seqlens = torch.tensor(cached, device=device, dtype=torch.int32)
    k_before, v_before = k_cache.clone(), v_cache.clone()

    out = flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, *((k_new, v_new) if append else ()),
                                             cache_seqlens=seqlens, causal=True, num_splits=num_splits)

    lengths = [n + new for n in cached] if append else cached
    keys = [torch.cat([k_before[b, :n], k_new[b]]) if append else k_before[b, :n] for b, n in enumerate(cached)]
    values = [torch.cat([v_before[b, :n], v_new[b]]) if append else v_before[b, :n] for b, n in enumerate(cached)]
    if append:
        for b, n in enumerate(cached):
            assert torch.equal(k_cache[b, :n + new], keys[b]), f"sequence {b}: the new keys were not appended at {n}"
            assert torch.equal(v_cache[b, :n + new], values[b]), f"sequence {b}: the new values were not appended at {n}"
    else:
        assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before), "a cache-only call changed the cache"
    what = f"flash_attn_with_kvcache {dtype} d={headdim} append={append} num_splits={num_splits}"
    for b, length in enumerate(lengths):
        def reference(q_b, k_b, v_b):
            return attention(q_b[None], k_b[None], v_b[None], causal=True)[0]

        assert keys[b].shape[0] == length
        compare_forward(out[b], reference, (q[b], keys[b], values[b]), seed=seed, what=f"{what}, sequence {b}")


@pytest.mark.parametrize("headdim", HEAD_DIMS)
def test_kvcache_without_seqlens_is_plain_causal_attention(device, seed, headdim):
    """The whole cache as context (no cache_seqlens): the split-kv kernel equals flash_attn_func."""
    require_head_dim(headdim)
    q = torch.randn(2, 7, 4, headdim, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 203, 4, headdim, device=device, dtype=torch.bfloat16) for _ in range(2))
    out = flash_attn.flash_attn_with_kvcache(q, k, v, causal=True, num_splits=3)
    compare_forward(out, functools.partial(attention, causal=True), (q, k, v), seed=seed,
                    what=f"flash_attn_with_kvcache, full cache, d={headdim}")
