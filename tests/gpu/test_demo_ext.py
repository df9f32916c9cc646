"""demo_ext.rms_norm, the demo extension's CUDA kernel, against a float64 PyTorch reference."""

from __future__ import annotations

import pytest
from gpu_env import import_or_skip

torch = import_or_skip("torch")
demo_ext = import_or_skip("demo_ext")

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]
# The kernel computes each element in float32 and rounds it once: within half an ulp (eps/2
# relative) for fp16/bf16; float32 itself is bounded by the float32 sum of squares.
RTOL = {torch.float32: 1e-5, torch.float16: 2**-10, torch.bfloat16: 2**-7}
ATOL = 1e-6  # fp16 subnormals near zero round on an absolute grid of 6e-8
# A single element, tiny rows, rows shorter and longer than the 256-thread block (and no multiple
# of it), leading batch dimensions, and more rows than a 16-bit grid dimension could address.
SHAPES = [(1, 1), (3, 7), (2, 33, 1000), (17, 8193), (70000, 64)]


def _reference(x, weight, eps: float):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.double()


def _check(x, weight, eps: float, *, seed: int) -> None:
    got = demo_ext.rms_norm(x, weight, eps)
    what = f"rms_norm {x.dtype} shape={tuple(x.shape)} eps={eps:g} seed={seed}"
    assert got.dtype == x.dtype and got.shape == x.shape, f"{what}: got {got.dtype} {tuple(got.shape)}"
    torch.testing.assert_close(
        got.double(), _reference(x, weight, eps), rtol=RTOL[x.dtype], atol=ATOL, msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(device, seed, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    weight = torch.randn(shape[-1], device=device, dtype=dtype)
    _check(x, weight, 1e-6, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_is_added_under_the_square_root(device, seed, dtype):
    # Mean square 1e-6 next to eps 1e-5: a kernel that added eps elsewhere (or dropped it) is off
    # by a factor of ~3, far outside the tolerance.
    x = torch.randn(64, 512, device=device, dtype=dtype) * 1e-3
    weight = torch.randn(512, device=device, dtype=dtype)
    _check(x, weight, 1e-5, seed=seed)


def test_non_contiguous_input(device, seed):
    x = torch.randn(300, 40, device=device, dtype=torch.bfloat16).t()
    weight = torch.randn(300, device=device, dtype=torch.bfloat16)
    assert not x.is_contiguous()
    _check(x, weight, 1e-6, seed=seed)


def test_no_rows(device):
    x = torch.empty(0, 64, device=device)
    assert demo_ext.rms_norm(x, torch.ones(64, device=device), 1e-6).shape == (0, 64)


def test_weight_of_the_wrong_size_is_refused(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(RuntimeError, match="weight must match the last dimension"):
        demo_ext.rms_norm(x, torch.ones(65, device=device), 1e-6)
