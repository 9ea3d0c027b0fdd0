"""Score functions and the registry on a tiny synthetic GQA model (no weights to load)."""

import pytest
import torch
from reference_scores import reference_scores
from scipy.stats import kstest
from tiny import random_sequences, tiny_gqa_model, value_weights

import inactive_heads as ih
from inactive_heads.scoring.scores import LayerActivations, layer_normalize


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model()


@pytest.fixture(scope="module")
def seqs():
    return random_sequences(7, seed=1)


def test_tiny_model_matches_reference_with_padding(tiny, seqs):
    ref = reference_scores(tiny, seqs)
    for bs in (1, 3, 7):
        hs = ih.record_scores(tiny, seqs, batch_size=bs, progress=False)
        for key, expected in ref.items():
            torch.testing.assert_close(hs[key], expected, rtol=1e-5, atol=1e-5, msg=f"{key} bs={bs}")


def test_zeroed_value_weights_give_zero_scores_and_are_flagged(seqs):
    model = tiny_gqa_model(seed=3)
    layer, kv_head = 1, 1
    with torch.no_grad():
        W_V, b_V = value_weights(model, layer)
        W_V[kv_head].zero_()
        b_V[kv_head].zero_()
    hs = ih.record_scores(model, seqs, ["ahon", "avvn", "ahon_ln", "avvn_ln", "ftvvn"], progress=False)
    group = model.cfg.n_heads // model.cfg.n_key_value_heads
    dead = list(range(kv_head * group, (kv_head + 1) * group))  # query heads reading that KV head
    alive = [h for h in range(model.cfg.n_heads) if h not in dead]
    for key in ("ahon", "avvn", "ahon_ln", "avvn_ln", "ftvvn"):
        assert (hs[key][:, layer, dead] == 0).all(), key
        assert (hs[key][:, layer, alive] > 0).all(), key
        score = ih.get_score(key)
        for tau in (1e-6, 0.1, 1.0):
            flagged = score.is_inactive(hs[key][:, layer], tau)
            assert flagged[:, dead].all(), (key, tau)


def test_layer_normalize_defines_zero_mean_as_zero():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    out = layer_normalize(x)
    assert torch.equal(out[0], torch.zeros(3))
    torch.testing.assert_close(out[1], torch.tensor([0.5, 1.0, 1.5]))


def test_register_custom_score_in_a_few_lines(tiny, seqs):
    @ih.register_score("max_key_weight", reads=("pattern",), direction="above", label="Max key weight")
    def max_key_weight(acts: LayerActivations):
        return acts.mean_over_queries(acts.pattern.amax(dim=-1))

    try:
        hs = ih.record_scores(tiny, seqs, ["max_key_weight", "awft"], batch_size=3, progress=False)
        assert hs["max_key_weight"].shape == hs["awft"].shape
        assert (hs["max_key_weight"] >= hs["awft"] - 1e-6).all()  # the max is at least A[t, 0]
        assert (hs["max_key_weight"] <= 1 + 1e-6).all()
        assert "max_key_weight" in ih.score_keys()
    finally:
        ih.unregister_score("max_key_weight")
    assert "max_key_weight" not in ih.score_keys()


def test_custom_score_with_wrong_shape_is_reported(tiny, seqs):
    @ih.register_score("bad_shape", reads=("z",), direction="below")
    def bad_shape(acts):
        return acts.z_norm  # [batch, pos, head]: one too many dimensions

    try:
        with pytest.raises(ValueError, match="bad_shape.*must return \\[batch, head\\]"):
            ih.record_scores(tiny, seqs, ["bad_shape"], progress=False)
    finally:
        ih.unregister_score("bad_shape")


def test_nan_never_reaches_a_result_silently(tiny, seqs):
    @ih.register_score("nan_score", reads=("z",), direction="below")
    def nan_score(acts):
        return torch.full((acts.z.shape[0], acts.n_heads), float("nan"))

    try:
        with pytest.raises(FloatingPointError, match="nan_score"):
            ih.record_scores(tiny, seqs, ["nan_score"], progress=False)
    finally:
        ih.unregister_score("nan_score")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(key="bad key", reads=("z",), direction="below"), "identifier"),
        (dict(key="x1", reads=("z",), direction="sideways"), "direction"),
        (dict(key="x2", reads=("hook_q",), direction="below"), "reads"),
        (dict(key="ahon", reads=("z",), direction="below"), "already registered"),
    ],
)
def test_registration_errors(kwargs, match):
    key = kwargs.pop("key")
    with pytest.raises(ValueError, match=match):
        ih.register_score(key, **kwargs)(lambda acts: None)


def test_unknown_score_lists_known_ones(tiny, seqs):
    with pytest.raises(KeyError, match="unknown score 'ahon_ln2'; known: awft"):
        ih.record_scores(tiny, seqs, ["ahon_ln2"], progress=False)


def test_bad_inputs(tiny):
    with pytest.raises(TypeError, match="not one string"):
        ih.record_scores(tiny, "just a string", progress=False)
    with pytest.raises(ValueError, match="inputs is empty"):
        ih.record_scores(tiny, [], progress=False)
    with pytest.raises(ValueError, match="input 1 is empty"):
        ih.record_scores(tiny, [[1, 2], []], progress=False)
    with pytest.raises(ValueError, match="more than the model context 64"):
        ih.record_scores(tiny, [[1] * 65], progress=False)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ih.record_scores(tiny, [[1, 2]], batch_size=0, progress=False)


def test_random_scores_are_seeded_and_uniform(tiny, seqs):
    a = ih.record_scores(tiny, seqs, ["random"], batch_size=2, progress=False, seed=5)["random"]
    b = ih.record_scores(tiny, seqs, ["random"], batch_size=7, progress=False, seed=5)["random"]
    c = ih.record_scores(tiny, seqs, ["random"], batch_size=7, progress=False, seed=6)["random"]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # One draw per (sequence, layer, head): no row of heads repeats (a seed shared by two sequences or
    # two layers would repeat one), and the draws do not read the tokens.
    rows = a.reshape(-1, a.shape[-1])
    assert len({tuple(r.tolist()) for r in rows}) == rows.shape[0] == len(seqs) * tiny.cfg.n_layers
    other_tokens = [[(t + 1) % 97 for t in s] for s in seqs]
    assert torch.equal(ih.record_scores(tiny, other_tokens, ["random"], progress=False, seed=5)["random"], a)
    # U(0, 1): 9000 draws (500 sequences x 3 layers x 6 heads) pass scipy's Kolmogorov-Smirnov test
    # (seeded: the p-value is fixed, 0.35 here).
    many = ih.record_scores(tiny, random_sequences(500, seed=2, max_len=4), ["random"], batch_size=100,
                            progress=False, seed=5)["random"]
    assert many.numel() == 9000
    assert kstest(many.flatten().double().numpy(), "uniform").pvalue > 0.05
