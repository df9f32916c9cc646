"""Hugging Face transformers with attn_implementation="flash_attention_2" on a tiny random Qwen2.

Three copies of one randomly initialised model (no download): flash_attention_2 and sdpa in bf16,
and eager in float64 as the truth. flash_attention_2 must be as close to the truth as sdpa is.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

import pytest
from gpu_env import built_head_dims, draw_seed, import_or_skip

torch = import_or_skip("torch")
import_or_skip("flash_attn")
transformers = import_or_skip("transformers")

from attention_ref import check_logits_close as _check_close  # noqa: E402

BATCH, PROMPT_LEN, NEW_TOKENS = 3, 77, 12
VOCAB = 1000
# Operators flash-attn >= 2.7 registers with torch; seeing one in a profile proves that our
# flash_attn ran, not a fallback transformers picked (it can fetch a hub kernel instead).
FLASH_OP_PREFIX = "flash_attn::"


# 64 where every head dim is built; a head-dim subset build gets a model of one of its own.
HEAD_DIM = 64 if built_head_dims() is None else built_head_dims()[0]


def _tiny_config():
    # A fresh config per model: from_config records the attention implementation on it.
    return transformers.Qwen2Config(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=512,
        vocab_size=VOCAB,
    )


def _detection_report() -> str:
    """What transformers' flash-attn detection looks at, for a failure message."""
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}"]
    spec = importlib.util.find_spec("flash_attn")
    lines.append(f"flash_attn module: {spec.origin if spec else None}")
    for dist in ("flash_attn", "flash-attn"):
        try:
            lines.append(f"importlib.metadata.version({dist!r}) = {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"importlib.metadata.version({dist!r}): no distribution metadata")
    mapping = importlib.metadata.packages_distributions().get("flash_attn")
    lines.append(f"packages_distributions()['flash_attn'] = {mapping}")
    lines.append(f"torch.cuda.is_available() = {torch.cuda.is_available()}")
    return "; ".join(lines)


@dataclass
class Models:
    seed: int
    flash: Any
    sdpa: Any
    exact: Any


def _build(attn_implementation: str, dtype, device, state=None):
    # dtype goes through .to(): the from_config keyword is torch_dtype before 4.56, dtype after.
    model = transformers.AutoModelForCausalLM.from_config(
        _tiny_config(), attn_implementation=attn_implementation
    )
    if state is not None:
        model.load_state_dict(state)
    model.generation_config.pad_token_id = 0
    return model.to(device=device, dtype=dtype).eval()


@pytest.fixture(scope="module")
def models(device) -> Models:
    if not transformers.utils.is_flash_attn_2_available():
        pytest.fail(
            "transformers does not detect flash-attn 2, so it would not use it: " + _detection_report(),
            pytrace=False,
        )
    seed = draw_seed()
    sdpa = _build("sdpa", torch.bfloat16, device)
    state = sdpa.state_dict()
    flash = _build("flash_attention_2", torch.bfloat16, device, state)
    exact = _build("eager", torch.float64, device, state)
    chosen = flash.config._attn_implementation
    assert chosen == "flash_attention_2", f"transformers chose {chosen!r}: " + _detection_report()
    return Models(seed, flash, sdpa, exact)


def _random_prompt(device):
    return torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), device=device)


def test_flash_attention_2_logits_match_sdpa(models, device):
    ids = _random_prompt(device)
    with torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = models.flash(input_ids=ids).logits
        baseline, exact = models.sdpa(input_ids=ids).logits, models.exact(input_ids=ids).logits
    ops = sorted({event.name for event in prof.events()})
    assert any(op.startswith(FLASH_OP_PREFIX) for op in ops), (
        f"no {FLASH_OP_PREFIX}* operator ran in the flash_attention_2 model; operators: {ops}"
    )
    _check_close(got, baseline, exact, what="flash_attention_2 logits", seed=models.seed)


def _greedy(model, ids):
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        return_dict_in_generate=True,
        output_scores=True,
    )


def _cache_length(cache) -> int:
    if hasattr(cache, "get_seq_length"):
        return cache.get_seq_length()
    return cache[0][0].shape[-2]  # legacy tuple of per-layer (key, value)


def test_generate_with_kv_cache(models, device):
    ids = _random_prompt(device)
    flash, sdpa = _greedy(models.flash, ids), _greedy(models.sdpa, ids)
    seqs = flash.sequences
    assert seqs.shape == (BATCH, PROMPT_LEN + NEW_TOKENS), f"generated {tuple(seqs.shape)}"
    assert torch.equal(seqs[:, :PROMPT_LEN], ids)
    assert flash.past_key_values is not None, "generate() kept no KV cache"
    # The last token is sampled but never fed back, so the cache holds one position less.
    assert _cache_length(flash.past_key_values) == PROMPT_LEN + NEW_TOKENS - 1

    # Each step's logits, computed from the KV cache (one query against all cached keys), must
    # match a fresh full-sequence forward of the float64 model as closely as sdpa's full forward.
    fed = seqs[:, :-1]
    with torch.no_grad():
        baseline = models.sdpa(input_ids=fed).logits[:, PROMPT_LEN - 1 :]
        exact = models.exact(input_ids=fed).logits[:, PROMPT_LEN - 1 :]
    _check_close(
        torch.stack(flash.scores, dim=1),
        baseline,
        exact,
        what="flash_attention_2 logits decoded with the KV cache",
        seed=models.seed,
    )

    # Greedy tokens must equal sdpa's, except that both bf16 models may break a near tie between
    # the two best of 1000 near-random logits differently. Once a row's tokens differ their
    # contexts differ, so only the first divergence is judged: it is allowed when, in sdpa's own
    # logits, flash's choice trails sdpa's by less than a tenth of the logits' spread.
    new_flash, new_sdpa = seqs[:, PROMPT_LEN:], sdpa.sequences[:, PROMPT_LEN:]
    for row in range(BATCH):
        differs = (new_flash[row] != new_sdpa[row]).nonzero()
        if len(differs) == 0:
            continue
        step = int(differs[0])
        logits = sdpa.scores[step][row].double()
        chose_sdpa, chose_flash = int(new_sdpa[row, step]), int(new_flash[row, step])
        gap = (logits[chose_sdpa] - logits[chose_flash]).item()
        assert gap <= 0.1 * logits.std().item(), (
            f"row {row}: greedy tokens diverge at new token {step} ({chose_flash} vs sdpa's "
            f"{chose_sdpa}), which sdpa scores {gap:.3g} apart (logits std {logits.std().item():.3g}); "
            f"flash {new_flash[row].tolist()} vs sdpa {new_sdpa[row].tolist()} (seed={models.seed})"
        )
