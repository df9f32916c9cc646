"""A head-dim subset build of flash-attn (flash_attn_head_dims): the built head dims compute
correctly, forward and backward, and any other head dim raises a ValueError naming the built
ones (never an undefined symbol or a silent wrong result). Skips on a full build."""

from __future__ import annotations

import functools

import pytest
from gpu_env import built_head_dims, import_or_skip

torch = import_or_skip("torch")
flash_attn = import_or_skip("flash_attn")

from attention_ref import attention, compare_with_reference  # noqa: E402

BUILT = built_head_dims()
pytestmark = pytest.mark.skipif(BUILT is None, reason="a full flash-attn build (every head dim)")
ALL = (32, 64, 96, 128, 192, 256)


def _qkv(device, headdim: int, dtype=torch.bfloat16):
    return [torch.randn(2, 173, 4, headdim, device=device, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("headdim", BUILT or ())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_built_head_dim_matches_reference(device, seed, headdim: int, causal: bool) -> None:
    compare_with_reference(
        functools.partial(flash_attn.flash_attn_func, causal=causal),
        functools.partial(attention, causal=causal),
        _qkv(device, headdim),
        seed=seed,
        what=f"subset build {BUILT}: flash_attn_func bf16 causal={causal} d={headdim}",
    )


@pytest.mark.parametrize("headdim", [d for d in ALL if d not in (BUILT or ALL)][:2])
def test_unbuilt_head_dim_is_a_clear_error(device, headdim: int) -> None:
    q, k, v = _qkv(device, headdim)
    built = ", ".join(map(str, BUILT or ()))
    with pytest.raises(ValueError, match=rf"head dim {headdim} is not built .*built head dims: {built}"):
        flash_attn.flash_attn_func(q, k, v)
    # The kv-cache path dispatches through the split-kv kernels, the same switch.
    with pytest.raises(ValueError, match="built head dims"):
        flash_attn.flash_attn_with_kvcache(q, k, v, causal=True)
