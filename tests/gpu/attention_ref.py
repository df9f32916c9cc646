"""Plain-PyTorch attention references and the error check the flash-attn tests share.

A result is judged the way flash-attn's own test-suite judges it: against an exact (float64)
reference computed from the same low-precision inputs, its error must stay within twice the error
of a straightforward PyTorch implementation computed in that same low precision. That bound
scales with the dtype by itself; the absolute caps below only stop a broken baseline from
excusing a broken kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Caps on the relative error (2-norm) against float64. bf16 keeps 8 significant bits and fp16 11,
# so output rounding alone costs ~2e-3 and ~3e-4; gradients pass through more rounding steps.
CAP = {
    torch.bfloat16: {"out": 1e-2, "grad": 4e-2},
    torch.float16: {"out": 2e-3, "grad": 5e-3},
}
# Absolute slack on the relative-error bound, far below either dtype's rounding error.
SLACK = 1e-4

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              keep: torch.Tensor | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Softmax attention computed in the inputs' dtype, in flash-attn's layout and semantics.

    q is (batch, seqlen_q, heads, dim); k and v are (batch, seqlen_k, kv_heads, dim) with heads a
    multiple of kv_heads (query head i reads kv head i // (heads // kv_heads)). The causal mask
    is aligned to the bottom-right corner, as in flash-attn >= 2.1: query i sees key j when
    j <= i + seqlen_k - seqlen_q, and a query that sees no key returns zeros. With dropout,
    `keep` (batch, heads, seqlen_q, seqlen_k) says which probabilities the kernel kept, and the
    kept ones are scaled by 1 / (1 - dropout_p).
    """
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q * q.shape[-1] ** -0.5, k)
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        hidden = cols > rows + (seqlen_k - seqlen_q)
        # A finite fill keeps fully hidden rows finite through softmax and its backward
        # (an all -inf row would turn into NaN gradients); those rows are zeroed just after.
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)
    else:
        probs = torch.softmax(scores, dim=-1)
    if keep is not None:
        probs = probs.masked_fill(~keep, 0.0) / (1.0 - dropout_p)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    diff = got.double() - ref.double()
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref.double())).item()


def compare_with_reference(
    kernel: Attention, reference: Attention, inputs: Sequence[torch.Tensor], *, seed: int, what: str
) -> None:
    """Check kernel's output and its dq, dk, dv against `reference` run in float64.

    inputs are q, k, v in the low precision under test; `reference` is run twice, in float64
    (the truth) and in that low precision (the baseline).
    """
    dtype = inputs[0].dtype
    grad_out = torch.randn_like(inputs[0])

    def run(fn: Attention, run_dtype: torch.dtype) -> list[torch.Tensor]:
        leaves = [x.detach().to(run_dtype).requires_grad_() for x in inputs]
        out = fn(*leaves)
        return [out, *torch.autograd.grad(out, leaves, grad_out.to(run_dtype))]

    got = run(kernel, dtype)
    exact = run(reference, torch.float64)
    baseline = run(reference, dtype)
    for name, g, e, b in zip(("out", "dq", "dk", "dv"), got, exact, baseline):
        _check(name, g, e, b, f"{what}, {name}, seed={seed}")


def compare_forward(out: torch.Tensor, reference: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], *,
                    seed: int, what: str) -> None:
    """Check a forward-only kernel's output (the kv-cache path has no backward) the same way."""
    exact = reference(*[x.double() for x in inputs])
    baseline = reference(*inputs)
    _check("out", out, exact, baseline, f"{what}, out, seed={seed}")


def _check(name: str, got: torch.Tensor, exact: torch.Tensor, baseline: torch.Tensor, context: str) -> None:
    dtype = got.dtype
    assert got.shape == exact.shape, f"{context}: shape {tuple(got.shape)}, expected {tuple(exact.shape)}"
    assert torch.isfinite(got).all(), f"{context}: {int((~torch.isfinite(got)).sum())} non-finite values"
    err, base = rel_error(got, exact), rel_error(baseline, exact)
    cap = CAP[dtype]["out" if name == "out" else "grad"]
    assert err <= 2 * base + SLACK and err <= cap, (
        f"{context}: relative error {err:.2e} vs float64; PyTorch in {dtype} has {base:.2e}; "
        f"allowed 2x that + {SLACK:g} and at most {cap:g}"
    )


# Logits of a whole model (transformers): twice the bf16 baseline's error (same weights, another
# attention kernel), plus slack, and never worse than the cap.
LOGITS_SLACK, LOGITS_CAP = 1e-3, 5e-2


def check_logits_close(got: torch.Tensor, baseline: torch.Tensor, exact: torch.Tensor, *, what: str, seed: int) -> None:
    assert torch.isfinite(got).all(), f"{what}: non-finite logits (seed={seed})"
    err, base = rel_error(got, exact), rel_error(baseline, exact)
    assert err <= 2 * base + LOGITS_SLACK and err <= LOGITS_CAP, (
        f"{what}: relative error {err:.2e} vs the float64 model; sdpa in bf16 has {base:.2e}; "
        f"allowed 2x that + {LOGITS_SLACK:g} and at most {LOGITS_CAP:g} (seed={seed})"
    )
