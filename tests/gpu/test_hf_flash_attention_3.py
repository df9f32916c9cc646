"""Hugging Face transformers with attn_implementation="flash_attention_3" on a tiny random
Qwen3-shaped model (head dim 128, or the largest a FlashAttention-3 subset has; grouped-query
attention): FlashAttention-3 from our package must be as close to a float64 eager model as sdpa
is, on a full batch and on a right-padded one (which transformers runs through the varlen
kernels). Padded rows are compared with the same sequence run unpadded: the references' own
outputs at padded positions are undefined (NaN in eager)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gpu_env import draw_seed, import_or_skip, unavailable

torch = import_or_skip("torch")
import_or_skip("flash_attn_interface")
transformers = import_or_skip("transformers")

from attention_ref import check_logits_close  # noqa: E402

VOCAB, BATCH, LEN = 1000, 3, 93
# Head dim 128 (Qwen3's), else the largest the installed FA3 subset has kernels for.
RECORD = Path(sys.prefix) / "share" / "extforge" / "build" / "flash-attn-3.json"
SUBSET = json.loads(RECORD.read_text())["subset"] if RECORD.is_file() else {"head_dims": [128], "features": ["varlen"]}
BUILT = SUBSET["head_dims"]
HEAD_DIM = 128 if 128 in BUILT else max(BUILT)
FA3_OP_PREFIX = "flash_attn_3::"


def _build(attn_implementation: str, dtype, device, state=None):
    config = transformers.Qwen3Config(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                                      num_hidden_layers=2, intermediate_size=512, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


@pytest.fixture(scope="module")
def models(device):
    if torch.cuda.get_device_capability(device)[0] != 9:
        unavailable("FlashAttention-3 kernels are sm_90a")
    detect = getattr(transformers.utils, "is_flash_attn_3_available", None)
    if detect is None:
        pytest.skip(f"transformers {transformers.__version__} has no flash_attention_3 implementation")
    if not detect():
        pytest.fail(f"transformers {transformers.__version__} does not detect flash_attn_3", pytrace=False)
    seed = draw_seed()
    sdpa = _build("sdpa", torch.bfloat16, device)
    state = sdpa.state_dict()
    fa3 = _build("flash_attention_3", torch.bfloat16, device, state)
    assert fa3.config._attn_implementation == "flash_attention_3"
    return seed, fa3, sdpa, _build("eager", torch.float64, device, state)


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_flash_attention_3_logits_match_sdpa(models, device, padded: bool) -> None:
    seed, fa3, sdpa, exact = models
    ids = torch.randint(1, VOCAB, (BATCH, LEN), device=device)
    lens = (LEN, LEN - 17, LEN - 40) if padded else (LEN,) * BATCH
    mask = (torch.arange(LEN, device=device)[None] < torch.tensor(lens, device=device)[:, None]).long()
    if padded and "varlen" not in SUBSET["features"]:
        # transformers runs a padded batch through the varlen kernels: upstream's clear error.
        with torch.no_grad(), pytest.raises(RuntimeError, match="does not support varlen"):
            fa3(input_ids=ids, attention_mask=mask)
        return
    with torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = fa3(input_ids=ids, attention_mask=mask).logits
        for row, n in enumerate(lens):
            one = ids[row:row + 1, :n]
            check_logits_close(got[row, :n], sdpa(input_ids=one).logits[0], exact(input_ids=one).logits[0],
                               what=f"flash_attention_3 logits, row of {n} of {LEN} tokens", seed=seed)
    ops = sorted({e.name for e in prof.events()})
    assert any(op.startswith(FA3_OP_PREFIX) for op in ops), f"no {FA3_OP_PREFIX}* operator ran; operators: {ops}"
