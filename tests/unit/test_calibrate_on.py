"""calibrate_on: the one "calibrate τ on this run's own inputs" of every entry point."""

import pytest
import torch

import inactive_heads as ih
from inactive_heads.prediction.oracle import calibrated_threshold
from inactive_heads.scoring.calibration import calibrate_on
from inactive_heads.scoring.recording import HeadScores
from tests.tiny import random_sequences, tiny_gqa_model
from tests.tiny_predictor import tiny_plan


def test_quantiles_by_hand_on_a_tiny_tensor():
    """Pooled values 4, 1, 3, 2: the CDF's points are (1, 1/4), (2, 2/4), (3, 3/4), (4, 1), joined
    linearly; a "below" score reads x at y = p, an "above" score at y = 1 - p."""
    values = torch.tensor([[[4.0, 1.0], [3.0, 2.0]]])  # [seq 1, layer 2, head 2]
    hs = HeadScores({"ahon_ln": values, "awft": values})
    below = calibrate_on(None, hs, "ahon_ln", [0.0, 0.25, 0.5, 0.6])
    assert below.values == pytest.approx([1.0, 1.0, 2.0, 2.4], abs=1e-12)
    assert below.n_scores == 4 and below.direction == "below"
    above = calibrate_on(None, hs, "awft", 0.1)  # y = 0.9: 3 + (0.9 - 0.75) / 0.25
    assert above.values == pytest.approx([3.6], abs=1e-12) and above.quantiles == (0.1,)


def test_random_thresholds_are_p_itself():
    assert calibrate_on(None, HeadScores({"ahon_ln": torch.ones(1, 2, 2)}), "random", [0.1, 0.3]).values == (0.1, 0.3)


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model(seed=2)


def test_recording_here_equals_the_scores_an_evaluation_records_in_pass(tiny):
    """The predict path once took its scores from evaluate(record=...); calibrate_on records them
    itself (record_scores): the same bits, so the same τ."""
    plan = tiny_plan(random_sequences(6, seed=5, min_len=4, max_len=15))
    in_pass = ih.evaluate(tiny, plan, record=["ahon_ln"], batch_size=4, progress=False).head_scores
    expected = ih.calibrate(in_pass, "ahon_ln", [0.1, 0.3]).values
    assert calibrate_on(tiny, plan.inputs, "ahon_ln", [0.1, 0.3], batch_size=3).values == expected
    assert calibrated_threshold(tiny, plan, "ahon_ln", 0.3) == expected[1]
