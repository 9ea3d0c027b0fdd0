"""Generation with heads zeroed on tiny GQA models: cached equals uncached, batched equals one at a
time, realized fractions and savings against hand counts, clear errors."""

import pytest
import torch

import inactive_heads as ih
from inactive_heads.ablation.head_ablation import DynamicAblation, RandomAblation, StaticAblation
from inactive_heads.core.errors import UserError
from inactive_heads.evaluation.generation import generate, held_savings
from inactive_heads.models.tl_line import is_hooked_transformer
from tests.tiny import random_sequences, tiny_gqa_model


@pytest.fixture(scope="module")
def model():
    """6 query heads on 2 KV heads, 3 layers; weights scaled so greedy outputs vary."""
    m = tiny_gqa_model(seed=2)
    with torch.no_grad():
        if is_hooked_transformer(m):
            m.W_E.normal_(0, 1.0)
            m.W_U.normal_(0, 1.0)
            for block in m.blocks:
                block.attn.W_O.mul_(4)
                block.attn.W_V.mul_(2)
        else:  # a bridge: the Hugging Face weights its forward reads
            hf = m.original_model
            hf.model.embed_tokens.weight.normal_(0, 1.0)
            hf.lm_head.weight.normal_(0, 1.0)
            for layer in hf.model.layers:
                layer.self_attn.o_proj.weight.mul_(4)
                layer.self_attn.v_proj.weight.mul_(2)
    return m


PROMPTS = random_sequences(4, seed=1, min_len=3, max_len=14)

ABLATIONS = {
    "none": lambda: None,
    "ahon_ln": lambda: DynamicAblation("ahon_ln", 0.9),
    "awft": lambda: DynamicAblation("awft", 0.4),
    "random": lambda: RandomAblation(0.3, seed=1),
}


def _run(model, ablation, **kwargs):
    kwargs = {"max_new_tokens": 7, "progress": False, **kwargs}
    return generate(model, PROMPTS, ablation=ABLATIONS[ablation](), **kwargs)


def test_outputs_vary(model):
    tokens = _run(model, "none", batch_size=4).tokens
    assert len({tuple(t) for t in tokens}) == len(PROMPTS)
    assert all(len(set(t)) > 1 for t in tokens[:3])


@pytest.mark.parametrize("ablation", ["ahon_ln", "awft", "random"])
def test_prompt_cached_equals_uncached_and_one_at_a_time(model, ablation):
    cached = _run(model, ablation, decision="prompt", use_cache=True, batch_size=3)
    assert cached.use_cache
    uncached = _run(model, ablation, decision="prompt", use_cache=False, batch_size=3)
    single = _run(model, ablation, decision="prompt", use_cache=True, batch_size=1)
    assert cached.tokens == uncached.tokens == single.tokens
    assert cached.realized_fraction == uncached.realized_fraction == single.realized_fraction


@pytest.mark.parametrize("ablation", ["awft", "random"])
def test_per_step_does_not_depend_on_batch_size(model, ablation):
    batched = _run(model, ablation, decision="per_step", batch_size=4)
    single = _run(model, ablation, decision="per_step", batch_size=1)
    assert batched.tokens == single.tokens
    assert batched.realized_fraction == pytest.approx(single.realized_fraction, abs=0)
    assert batched.n_forward_passes == sum(len(t) for t in batched.tokens)


# Four prompts with a shared 36-token prefix (few-shot examples) and their own tails, and one alone.
_SHARED = random_sequences(1, seed=7, min_len=36, max_len=36)[0]
SHARED_PROMPTS = [_SHARED + tail for tail in random_sequences(4, seed=8, min_len=1, max_len=6)] + [PROMPTS[0]]


@pytest.mark.parametrize("ablation", ["none", "ahon_ln", "awft"])
def test_per_step_with_prefix_reuse_equals_the_full_rerun(model, ablation):
    # Reuse computes each state once per decision history: the shared prefix once, then each step
    # only the newest token; tokens and the per-pass decisions (realized fraction) must be those of
    # the full re-run.
    full = generate(model, SHARED_PROMPTS, ablation=ABLATIONS[ablation](), decision="per_step",
                    max_new_tokens=7, batch_size=3, progress=False)
    reused = generate(model, SHARED_PROMPTS, ablation=ABLATIONS[ablation](), decision="per_step",
                      max_new_tokens=7, batch_size=3, progress=False, reuse_prefix=True)
    assert reused.tokens == full.tokens
    assert reused.realized_fraction == pytest.approx(full.realized_fraction, abs=1e-12)
    assert reused.realized_fraction_per_layer == pytest.approx(full.realized_fraction_per_layer, abs=1e-12)
    if ablation != "none":
        assert 0 < full.realized_fraction < 1  # the thresholds flag some heads, not all
    assert reused.n_forward_passes == full.n_forward_passes == sum(len(t) for t in full.tokens)
    assert full.prefix_reuse == {"used": False}
    stats, n_layers = reused.prefix_reuse, model.cfg.n_layers
    assert stats["used"] and stats["prompts_reused"] == 5 and stats["prompts_sharing_a_prefix"] == 4
    # Every pass runs only its newest tokens against the states of the sequence so far: each of the
    # two starting prefixes (the shared one, the lone prompt's) is computed once per layer, and
    # after that only where a decision differs from the step before (a branch).
    assert stats["prefix_layers_needed"] == n_layers * full.n_forward_passes
    if ablation == "none":
        assert stats["prefix_layers_computed"] == 2 * n_layers and stats["branches"] == 0
    assert stats["hit_rate"] > 0.5


def test_per_step_prefix_reuse_runs_random_in_full(model):
    # Random draws per sequence: nothing to share, so it runs whole sequences, as without reuse.
    full = _run(model, "random", decision="per_step")
    reused = _run(model, "random", decision="per_step", reuse_prefix=True)
    assert reused.prefix_reuse == {"used": False}
    assert reused.tokens == full.tokens and reused.realized_fraction == full.realized_fraction


@pytest.mark.hooked
def test_cached_logits_equal_a_full_recompute(model):
    # One decode step by hand: the cached path's next-token logits against a whole-sequence pass.
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    prompt = PROMPTS[0]
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, "cpu", 2)
    width = max(len(PROMPTS[0]), len(PROMPTS[1]))
    tokens = torch.zeros((2, width), dtype=torch.long)
    mask = torch.zeros((2, width), dtype=torch.long)
    for r, p in enumerate(PROMPTS[:2]):
        tokens[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    with torch.no_grad():
        model(tokens, attention_mask=mask, past_kv_cache=cache)
        nxt = torch.tensor([[5], [7]])
        step = model(nxt, attention_mask=torch.ones_like(nxt), past_kv_cache=cache)[0, -1]
        full = model(torch.tensor([prompt + [5]]))[0, -1]
    assert torch.allclose(step, full, atol=1e-5)


def test_bridge_cached_logits_equal_a_full_recompute(model):
    # The bridge's cached decoding by hand: two prompts of different lengths left-padded and
    # prefilled, one token each, then the shorter one alone (its cache row kept, the other
    # dropped) for one more; each step's logits against the bridge's own forward on the whole
    # sequence. Positions from the mask matter: off by one, these logits move by ~1e-2.
    if is_hooked_transformer(model):
        pytest.skip("a TransformerBridge's Hugging Face cache (TransformerLens 4)")
    from inactive_heads.evaluation.decoding import left_padded
    from inactive_heads.runtime.lines.bridge import CachedDecoder
    from inactive_heads.runtime.fast_attention import attention_form

    short, long = PROMPTS[0], PROMPTS[1]
    assert len(short) < len(long)
    with torch.inference_mode(), attention_form(model, "exact"):
        batch = CachedDecoder(model, *left_padded([short, long], [0, 1]))
        first = batch.logits
        step = batch.step(torch.tensor([5, 7]))
        batch.keep(torch.tensor([0]))
        second = batch.step(torch.tensor([9]))
        full = [model(torch.tensor([seq]))[0, -1] for seq in (short, long, short + [5], long + [7], short + [5, 9])]
    for got, want in zip([first[0], first[1], step[0], step[1], second[0]], full):
        assert (got - want).abs().max() <= 1e-4 * max(1.0, float(want.abs().max()))


def test_static_realized_fraction_and_savings_by_hand(model):
    # Layer 1: heads 0, 1, 2 = the whole first KV group; layer 2: head 4. 4 of 3 * 6 = 18 heads.
    heads = [(1, 0), (1, 1), (1, 2), (2, 4)]
    runs = {}
    for decision in ("prompt", "per_step"):
        out = runs[decision] = generate(model, PROMPTS, ablation=StaticAblation(heads), decision=decision,
                                        max_new_tokens=6, progress=False)
        assert out.realized_fraction == pytest.approx(4 / 18, abs=1e-12)
        assert out.realized_fraction_per_layer == pytest.approx([0.0, 3 / 6, 1 / 6], abs=1e-12)
    assert runs["per_step"].savings is None
    savings = runs["prompt"].savings
    assert savings["kind"] == "estimated"
    # KV: one of 3 layers x 2 KV heads is wholly held: 2 (K, V) * d_head 8 * 4 bytes per token.
    assert savings["kv_cache_bytes_saved_per_token"] == 2 * 8 * 4
    assert savings["kv_cache_bytes_per_token"] == 2 * 8 * 4 * 3 * 2
    assert savings["kv_cache_saved_fraction"] == pytest.approx(1 / 6)
    # Decode FLOPs (2 per multiply-add, matrix products only), by hand from the model's sizes: per
    # token with c keys, a query head 4 D d + 4 d c (q, o, scores, weighted sum), a KV head 4 D d
    # (k, v), the gated MLPs 3 * 2 D M per layer, the LM head 2 D V. Held: 4 query heads, 1 KV head.
    info = ih.model_info(model)
    D, d, M, V = info.d_model, 8, 64, 97
    saved = total = 0.0
    lengths = [len(t) for t in runs["prompt"].tokens]
    for prompt, generated in zip(PROMPTS, lengths):
        for k in range(1, generated):
            c = len(prompt) + k
            saved += 4 * (4 * D * d + 4 * d * c) + 4 * D * d
            total += 3 * (6 * (4 * D * d + 4 * d * c) + 2 * 4 * D * d + 3 * 2 * D * M) + 2 * D * V
    assert savings["decode_flops_saved_fraction"] == pytest.approx(saved / total, rel=1e-12)
    assert savings["decode_flops_saved_per_token"] == pytest.approx(saved / sum(lengths), rel=1e-12)


def test_held_savings_counts_keys_by_hand(model):
    masks = torch.zeros((1, 3, 6), dtype=torch.bool)
    masks[0, 0, 5] = True
    # Prompt of 4 tokens, 3 generated: decode steps see 5 and 6 keys; per step the held head's q and
    # o projections (4 * d_model * d_head 8) and its attention (4 * d_head 8 * keys).
    s = held_savings(model, [[1, 2, 3, 4]], masks, [3])
    d_model = ih.model_info(model).d_model
    assert s["decode_flops_saved_per_token"] == pytest.approx((2 * 4 * d_model * 8 + 4 * 8 * 11) / 3)
    assert s["kv_cache_bytes_saved_per_token"] == 0.0


def test_prompt_fraction_weights_each_prompt_by_its_tokens(model):
    out = _run(model, "ahon_ln", decision="prompt", until=(), eos_token_id=None)
    assert out.realized_fraction_prompts is not None and 0 < out.realized_fraction < 1
    # Every prompt generates 7 tokens here, so the per-pass and per-prompt counts agree.
    assert out.realized_fraction == pytest.approx(out.realized_fraction_prompts, abs=1e-12)


def test_eos_stops_each_row(model):
    free = _run(model, "none", batch_size=4).tokens
    eos = free[0][2]
    out = _run(model, "none", batch_size=4, eos_token_id=eos)
    for before, after in zip(free, out.tokens):
        cut = before.index(eos) + 1 if eos in before else len(before)
        assert after == before[:cut]
    per_step = _run(model, "none", batch_size=2, eos_token_id=eos, decision="per_step")
    assert per_step.tokens == out.tokens


def test_zeroed_nan_does_not_survive(model):
    # A held head whose output is NaN must be gone (masked_fill, not a multiply).
    def poison(z, hook):
        z = z.clone()
        z[:, :, 3] = float("nan")
        return z

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", poison)]):
        out = generate(model, PROMPTS[:2], ablation=StaticAblation([(0, 3)]), max_new_tokens=3, progress=False)
    clean = generate(model, PROMPTS[:2], ablation=StaticAblation([(0, 3)]), max_new_tokens=3, progress=False)
    assert out.tokens == clean.tokens


@pytest.mark.parametrize("kwargs, match", [
    ({"decision": "each_token"}, "decision must be one of"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 64}, "less than the model context"),
    ({"batch_size": 0}, "batch_size"),
    ({"until": ("Q:",), "max_new_tokens": 4}, "tokenizer"),
    ({"reuse_prefix": True, "decision": "prompt", "max_new_tokens": 4}, "reuse_prefix applies to decision='per_step'"),
])
def test_bad_input(model, kwargs, match, monkeypatch):
    if match == "tokenizer":  # stop strings on a model without a tokenizer (the bridge has one)
        monkeypatch.setattr(model, "tokenizer", None)
    with pytest.raises(UserError, match=match):
        generate(model, PROMPTS, progress=False, **kwargs)


def test_evaluate_keeps_generation_options_to_generation_tasks(model):
    with pytest.raises(UserError, match="generation tasks"):
        ih.evaluate(model, "mmlu", decision="prompt")
    with pytest.raises(UserError, match="log-likelihood tasks only"):
        ih.evaluate(model, "gsm8k", subjects=["anatomy"])
