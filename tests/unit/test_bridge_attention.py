"""The attention forms on a TransformerLens 4 ``TransformerBridge`` (tiny GQA Llama): what the
allow-list refuses, the first-use check, and attention over a Hugging Face KV cache.

The reference is always the bridge's own forward; the forms shared with a ``HookedTransformer``
(fused and exact logits, hooks, pattern edits, nesting) are tested in test_fast_attention.py.
"""

import warnings

import pytest
import torch
from tiny import random_sequences, tiny_gqa_model

from inactive_heads.models.tl_line import has_hooked_transformer
from inactive_heads.runtime.fast_attention import fast_attention, supports_fast_attention
from inactive_heads.runtime.hooks import make_batches

pytestmark = pytest.mark.skipif(has_hooked_transformer(), reason="the bridge's forms run on TransformerLens 4")


@pytest.fixture(scope="module")
def batch():
    return next(make_batches(random_sequences(5, seed=2, min_len=5, max_len=20), 5))


def _forward(model, batch):
    with torch.inference_mode():
        return model(batch.tokens, attention_mask=batch.valid.long())


def _patched(model) -> bool:
    return any("forward" in block.attn.__dict__ for block in model.blocks)


def test_a_soft_capped_bridge_is_refused_by_name_and_runs_its_own_forward_quietly(batch):
    from inactive_heads.runtime.bridge_attention import unsupported_reason

    capped = tiny_gqa_model(seed=4)
    capped.blocks[1].attn.original_component.attn_logit_softcapping = 30.0
    assert unsupported_reason(capped) == "layer 1's attention has attn_logit_softcapping"
    assert not supports_fast_attention(capped)
    ref = _forward(capped, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bridge outside the list runs as it always did: no warning
        with fast_attention(capped) as on:
            assert not on and not _patched(capped)
            assert torch.equal(_forward(capped, batch), ref)


def test_first_use_check_catches_what_the_forward_does_not_compute(batch, monkeypatch):
    """A soft cap let through the allow-list on purpose: the bridge applies it, this forward does
    not; the first batch's check warns and the bridge's own forward runs, to the bit."""
    import inactive_heads.runtime.bridge_attention as ba

    monkeypatch.setattr(ba, "_REFUSED_ATTRIBUTES", ())
    capped = tiny_gqa_model(seed=6)
    for block in capped.blocks:
        block.attn.original_component.attn_logit_softcapping = 0.05  # tight: changes every layer
    ref = _forward(capped, batch)
    warned = (r"^fast_attention: .*exact form's attn output at layer 0 differs from TransformerLens's own "
              r"forward by .*using TransformerLens's forward")
    with pytest.warns(UserWarning, match=warned), fast_attention(capped, fused=False) as on:
        first = _forward(capped, batch)
    assert on
    assert torch.equal(first, ref)


@pytest.mark.parametrize("fused", [True, False], ids=["fast", "exact"])
def test_decoding_over_a_kv_cache_equals_one_full_forward(fused):
    """Hugging Face's cache: 7 tokens, then 3 one at a time, in a form; each step's logits equal
    the full sequence's at that position in the bridge's own forward (no cache)."""
    from transformers import DynamicCache

    model = tiny_gqa_model(seed=5)
    hf = model.original_model
    tokens = torch.tensor(random_sequences(1, seed=7, min_len=10, max_len=10))
    with torch.inference_mode():
        full = hf(input_ids=tokens, use_cache=False).logits[0]
        steps = []
        with fast_attention(model, fused=fused) as on:
            cache = DynamicCache()
            out = hf(input_ids=tokens[:, :7], past_key_values=cache, use_cache=True)
            steps.append(out.logits[0])
            for i in range(7, 10):
                out = hf(input_ids=tokens[:, i:i + 1], past_key_values=cache, use_cache=True)
                steps.append(out.logits[0])
    assert on
    got = torch.cat(steps)
    assert got.shape == full.shape
    assert (got - full).abs().max() <= 1e-5
