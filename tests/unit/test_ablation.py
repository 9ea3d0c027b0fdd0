"""Ablation at hook_z on a tiny synthetic GQA model: exactness, realized fractions, the cascade."""

import pytest
import torch
from tiny import random_sequences, tiny_gqa_model, value_weights

import inactive_heads as ih
from inactive_heads.ablation.head_ablation import AblationSpec, DynamicAblation, RandomAblation, StaticAblation, zero_heads_hook


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model(seed=2)


@pytest.fixture(scope="module")
def tokens():
    return torch.tensor(random_sequences(4, seed=9, min_len=12, max_len=12))


def attn_outputs(model, tokens, ablation=None):
    names = [f"blocks.{l}.hook_attn_out" for l in range(model.cfg.n_layers)]
    names += [f"blocks.{l}.attn.hook_z" for l in range(model.cfg.n_layers)]
    if ablation is None:
        logits, cache = model.run_with_cache(tokens, names_filter=names)
        return logits, cache
    with ablation.apply(model):
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    return logits, cache


def test_zeroing_every_head_leaves_exactly_the_bias(tiny, tokens):
    L, H = tiny.cfg.n_layers, tiny.cfg.n_heads
    every = StaticAblation([(l, h) for l in range(L) for h in range(H)])
    _, cache = attn_outputs(tiny, tokens, every)
    for l in range(L):
        out = cache[f"blocks.{l}.hook_attn_out"]
        assert torch.equal(out, tiny.blocks[l].attn.b_O.expand_as(out)), l
    assert every.stats.realized_fraction == 1.0


@pytest.mark.parametrize("layer, head", [(0, 0), (1, 4), (2, 5)])
def test_zeroing_one_head_removes_exactly_its_contribution(tiny, tokens, layer, head):
    _, plain = attn_outputs(tiny, tokens)
    _, ablated = attn_outputs(tiny, tokens, StaticAblation([(layer, head)]))
    z = plain[f"blocks.{layer}.attn.hook_z"][:, :, head]
    contribution = z @ tiny.blocks[layer].attn.W_O[head]
    delta = plain[f"blocks.{layer}.hook_attn_out"] - ablated[f"blocks.{layer}.hook_attn_out"]
    torch.testing.assert_close(delta, contribution, rtol=1e-5, atol=1e-5)
    for l in range(layer):  # earlier layers are untouched
        assert torch.equal(plain[f"blocks.{l}.hook_attn_out"], ablated[f"blocks.{l}.hook_attn_out"])


@pytest.mark.parametrize("score, tau", [("ahon_ln", -1.0), ("lthon", 0.0), ("awft", 1.5), ("awft_ln", 1e9)])
def test_dynamic_ablation_that_flags_nothing_changes_nothing(tiny, tokens, score, tau):
    plain = tiny(tokens)
    abl = DynamicAblation(score, tau)
    with abl.apply(tiny):
        out = tiny(tokens)
    assert torch.equal(out, plain)
    assert abl.stats.realized_fraction == 0.0
    assert abl.stats.n_sequences == tokens.shape[0]


def test_dynamic_ablation_that_flags_everything_equals_zeroing_all(tiny, tokens):
    L, H = tiny.cfg.n_layers, tiny.cfg.n_heads
    every = StaticAblation([(l, h) for l in range(L) for h in range(H)])
    with every.apply(tiny):
        expected = tiny(tokens)
    for score, tau in (("ahon", 1e9), ("awft", -1.0)):
        abl = DynamicAblation(score, tau)
        with abl.apply(tiny):
            out = tiny(tokens)
        assert torch.equal(out, expected)
        assert abl.stats.realized_fraction == 1.0


def test_static_realized_fraction_is_exact(tiny, tokens):
    abl = StaticAblation([(0, 1), (0, 2), (2, 5)])
    with abl.apply(tiny):
        tiny(tokens)
    L, H = tiny.cfg.n_layers, tiny.cfg.n_heads
    assert abl.stats.realized_fraction == pytest.approx(3 / (L * H))
    assert abl.stats.realized_fraction_per_layer == pytest.approx([2 / H, 0.0, 1 / H])
    mask = abl.stats.flagged_mask()
    assert mask.shape == (tokens.shape[0], L, H)
    assert mask[:, 0, 1].all() and mask[:, 2, 5].all() and mask.sum() == 3 * tokens.shape[0]


def test_dynamic_flags_exactly_the_dead_heads():
    model = tiny_gqa_model(seed=4)
    with torch.no_grad():  # KV head 0 of layer 1 has no values: query heads 0..2 output nothing
        W_V, b_V = value_weights(model, 1)
        W_V[0].zero_()
        b_V[0].zero_()
    tokens = torch.tensor(random_sequences(3, seed=5, min_len=10, max_len=10))
    abl = DynamicAblation("ahon_ln", 1e-3)
    with abl.apply(model):
        model(tokens)
    mask = abl.stats.flagged_mask()
    expected = torch.zeros_like(mask)
    expected[:, 1, :3] = True
    assert torch.equal(mask, expected)
    assert abl.stats.realized_fraction == pytest.approx(3 / 18)


def test_cascade_later_layers_are_scored_after_earlier_zeroing(tiny, tokens):
    """The layer-2 decision equals scoring a model whose earlier flagged heads are zeroed."""
    seqs = tokens.tolist()
    plain = ih.record_scores(tiny, seqs, ["ahon_ln"], progress=False)["ahon_ln"]
    tau = float(plain[:, 0].median())  # flags about half of layer 0's heads
    abl = DynamicAblation("ahon_ln", tau)
    with abl.apply(tiny):
        tiny(tokens)
    mask = abl.stats.flagged_mask()
    assert mask[:, 0].any() and not mask[:, 0].all()
    for b, seq in enumerate(seqs):
        earlier = [(l, h) for l in range(2) for h in range(6) if mask[b, l, h]]
        static = StaticAblation(earlier)
        scores = {}

        @ih.register_score("_probe", reads=("z",), direction="below", overwrite=True)
        def _probe(acts):
            return ih.get_score("ahon_ln")(acts)

        try:
            with static.apply(tiny):
                scores = ih.record_scores(tiny, [seq], ["_probe"], progress=False)["_probe"]
        finally:
            ih.unregister_score("_probe")
        assert torch.equal(scores[0, 2] < tau, mask[b, 2]), b


def test_random_ablation_is_seeded_and_close_to_p(tiny):
    tokens = torch.tensor(random_sequences(40, seed=1, min_len=5, max_len=5))
    fractions = []
    masks = []
    for seed in (0, 0, 1):
        abl = RandomAblation(0.3, seed=seed)
        with abl.apply(tiny):
            tiny(tokens)
        fractions.append(abl.stats.realized_fraction)
        masks.append(abl.stats.flagged_mask())
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    assert abs(fractions[0] - 0.3) < 0.06  # 720 Bernoulli(0.3) draws: sd 0.017


def test_zero_heads_hook_for_custom_hooks(tiny, tokens):
    with tiny.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_heads_hook([2, 3]))]):
        custom = tiny(tokens)
    with StaticAblation([(1, 2), (1, 3)]).apply(tiny):
        built_in = tiny(tokens)
    assert torch.equal(custom, built_in)


def test_spec_round_trip_and_errors(tiny):
    for spec in (
        AblationSpec("static", heads=((0, 1), (2, 3))),
        AblationSpec("dynamic", score="ahon_ln", threshold=0.4),
        AblationSpec("random", threshold=0.1, seed=3),
    ):
        assert AblationSpec.from_dict(spec.to_dict()) == spec
        assert spec.build().spec == spec
    with pytest.raises(ValueError, match="unknown ablation kind 'zap'"):
        AblationSpec("zap")
    with pytest.raises(KeyError, match="unknown score 'ahon_ln2'"):
        AblationSpec("dynamic", score="ahon_ln2", threshold=0.1)
    with pytest.raises(ValueError, match="finite threshold"):
        AblationSpec("dynamic", score="ahon_ln", threshold=float("nan"))
    with pytest.raises(ValueError, match="probability"):
        RandomAblation(1.5)
    with pytest.raises(ValueError, match=r"head \(7, 0\) does not exist"):
        with StaticAblation([(7, 0)]).apply(tiny):
            pass


def test_apply_numbers_the_rows_of_each_forward_pass_after_the_previous_ones(tiny):
    # Two passes of two rows inside one apply() are four sequences: the same masks as one pass of
    # the four rows together (Random draws per sequence id), four entries in stats.masks.
    tokens = torch.tensor(random_sequences(2, seed=3, min_len=10, max_len=10))
    split = RandomAblation(0.5, seed=1)
    with split.apply(tiny):
        tiny(tokens)
        tiny(tokens)
    joint = RandomAblation(0.5, seed=1)
    with joint.apply(tiny):
        tiny(torch.cat([tokens, tokens]))
    assert split.stats.n_sequences == 4
    assert sorted(split.stats.masks) == [0, 1, 2, 3]
    assert torch.equal(split.stats.flagged_mask(), joint.stats.flagged_mask())
    assert not torch.equal(split.stats.masks[0], split.stats.masks[2])  # not the same draw again


@pytest.mark.hooked
def test_a_hookedtransformer_subclass_takes_the_hookedtransformer_paths():
    # e.g. SAELens' HookedSAETransformer: the type's name differs, isinstance does not.
    from transformer_lens import HookedTransformer

    from inactive_heads.evaluation.evaluator import _logits_at
    from inactive_heads.runtime.fast_attention import supports_fast_attention

    model = tiny_gqa_model(seed=4)
    model.__class__ = type("HookedSAELikeTransformer", (HookedTransformer,), {})
    assert supports_fast_attention(model)
    shapes = []
    model.unembed.register_forward_hook(lambda module, args, out: shapes.append(tuple(args[0].shape)))
    tokens = torch.tensor(random_sequences(2, seed=1, min_len=6, max_len=6))
    _logits_at(model, tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor([0, 1]), torch.tensor([5, 5]))
    assert shapes == [(2, 1, model.cfg.d_model)]  # unembedding of the two answer positions only


def test_as_ablation_takes_a_spec_its_dict_text_or_an_instance_and_refuses_the_rest():
    from inactive_heads.ablation.coerce import as_ablation

    spec = AblationSpec("static", heads=((1, 2), (0, 1)))
    from_dict = as_ablation(spec.to_dict())
    assert isinstance(from_dict, StaticAblation) and set(from_dict.spec.heads) == {(1, 2), (0, 1)}
    instance = RandomAblation(0.5, seed=3)
    assert as_ablation(instance) is instance and as_ablation(None) is None
    assert as_ablation("static:1.2").heads == ((1, 2),)  # the lm-eval text grammar, everywhere
    with pytest.raises(ih.UserError, match=r"^ablation must be None, a HeadAblation, .* got int$"):
        as_ablation(3)
    with pytest.raises(ih.UserError, match="only the lm-eval model does"):
        as_ablation("ahon_ln@p0.1")
