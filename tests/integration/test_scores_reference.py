"""The streaming in-hook scores equal a slow reference from a full cache, on SmolLM2 (GQA 9/3)."""

import pytest
import torch
from reference_scores import reference_scores

import inactive_heads as ih
from inactive_heads.scoring.scores import APPENDIX_SCORES

TEXTS = [
    "The following are multiple choice questions (with answers) about anatomy.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Question: How do you open a jar?\nAnswer:",
    "A",
    "In 1905 Einstein published four papers that changed physics: on the photoelectric effect, "
    "Brownian motion, special relativity and the equivalence of mass and energy.",
]
# The built-in scores (a score registered by other test code is not this file's to check).
REFERENCE_KEYS = [k for k in (*ih.PAPER_SCORES, *APPENDIX_SCORES) if k != "random"]


@pytest.fixture(scope="module")
def sequences(smollm2):
    return [smollm2.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def reference(smollm2, sequences):
    return reference_scores(smollm2, sequences)


@pytest.fixture(scope="module", params=[pytest.param("hooked", marks=pytest.mark.hooked), "bridge"])
def model(request):
    return request.getfixturevalue(f"smollm2_{request.param}")


@pytest.fixture(scope="module")
def recorded(model, sequences):
    return {bs: ih.record_scores(model, sequences, batch_size=bs, progress=False) for bs in (1, 5)}


def test_lengths_differ_so_padding_is_exercised(sequences):
    assert len({len(s) for s in sequences}) == len(sequences)


@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize("key", REFERENCE_KEYS)
def test_streaming_equals_reference(recorded, reference, key, batch_size):
    torch.testing.assert_close(recorded[batch_size][key], reference[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", ih.score_keys())
def test_identical_across_batch_sizes(recorded, key):
    torch.testing.assert_close(recorded[1][key], recorded[5][key], rtol=1e-5, atol=1e-5)


def test_strings_and_token_ids_give_the_same_scores(model, recorded):
    from_text = ih.record_scores(model, TEXTS, ["ahon_ln", "awft"], batch_size=5, progress=False)
    torch.testing.assert_close(from_text["ahon_ln"], recorded[5]["ahon_ln"], rtol=0, atol=0)


def test_value_scores_are_shared_within_a_kv_group(recorded):
    hs = recorded[5]
    for key in ("ftvvn", "avvn"):
        grouped = hs[key].reshape(hs.n_sequences, hs.n_layers, 3, 3)  # 3 KV heads x 3 query heads
        assert torch.equal(grouped, grouped[..., :1].expand_as(grouped))
    assert not torch.equal(hs["ahon"][..., 0], hs["ahon"][..., 1])  # head outputs do differ


def test_bounds(recorded, sequences):
    hs = recorded[5]
    assert hs["awft"].min() >= 0 and hs["awft"].max() <= 1 + 1e-6
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.float32)[:, None, None]
    # ||o_last|| <= sum_t ||o_t|| = T * mean, so the head-normalized score is at most T.
    assert (hs["lthon_hn"] <= lengths + 1e-4).all()
    assert (hs["aeqd"] >= 0).all()
    # a single-token sequence attends only to itself: AWFT = 1, entropy = 0
    single = [i for i, s in enumerate(sequences) if len(s) == 1][0]
    torch.testing.assert_close(hs["awft"][single], torch.ones_like(hs["awft"][single]))
    torch.testing.assert_close(hs["aeqd"][single], torch.zeros_like(hs["aeqd"][single]))
    for key in ih.score_keys():
        assert torch.isfinite(hs[key]).all(), key


def test_layer_normalized_scores_average_to_one(recorded):
    hs = recorded[5]
    for key in ("awft_ln", "aeqd_ln", "ahon_ln", "avvn_ln", "fho_ln"):
        means = hs[key].mean(dim=-1)
        ok = (means - 1).abs() < 1e-5
        # a layer where every head scores 0 (e.g. entropy on a one-token input) is defined as 0
        assert (ok | (means == 0)).all(), key


def test_save_load_round_trip(recorded, tmp_path):
    hs = recorded[5]
    path = hs.save(tmp_path / "scores.pt")
    back = ih.HeadScores.load(path)
    assert back.keys() == hs.keys()
    assert back.metadata == hs.metadata
    for key in hs.keys():
        assert torch.equal(back[key], hs[key])
    frame = hs.to_dataframe(["ahon_ln"])
    assert list(frame.columns) == ["sequence", "layer", "head", "score", "value"]
    assert len(frame) == hs.n_sequences * hs.n_layers * hs.n_heads
