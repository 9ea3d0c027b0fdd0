"""Bootstrap intervals and the label-free paired measures, against independent sources."""

import numpy as np
import pytest
from scipy import stats

from inactive_heads.analysis import (
    accuracy_interval,
    answer_agreement,
    bootstrap_indices,
    choice_kl,
    chosen_answers,
    curve_intervals,
    difference_interval,
    max_fraction_within,
    max_fraction_within_batch,
    normalized_auc,
    questions_to_resolve,
)


def test_bootstrap_interval_of_a_proportion_matches_wilson_for_large_n():
    # 1200 of 3000 correct (40 %): scipy's Wilson interval is about ±1.75 points.
    correct = np.zeros(3000, dtype=bool)
    correct[:1200] = True
    ci = accuracy_interval(correct, n_resamples=2000, seed=3)
    wilson = stats.binomtest(1200, 3000).proportion_ci(confidence_level=0.95, method="wilson")
    assert ci.estimate == pytest.approx(40.0)
    assert ci.low == pytest.approx(100 * wilson.low, abs=0.25)
    assert ci.high == pytest.approx(100 * wilson.high, abs=0.25)


def test_same_seed_same_interval_other_seed_other_draws():
    correct = np.random.default_rng(0).random(200) < 0.5
    first = accuracy_interval(correct, seed=7)
    np.random.seed(12345)  # disturb the global generators: the interval must depend on its seed only
    np.random.random(17)
    again = accuracy_interval(correct, seed=7)
    assert (again.estimate, again.low, again.high) == (first.estimate, first.low, first.high)
    assert not np.array_equal(bootstrap_indices(50, 10, seed=1), bootstrap_indices(50, 10, seed=2))


def test_paired_difference_is_exactly_zero_when_no_answer_changed():
    # An unpaired bootstrap would give about ±10 points here; paired, nothing can move.
    correct = np.random.default_rng(1).random(100) < 0.4
    ci = difference_interval(correct, correct)
    assert (ci.estimate, ci.low, ci.high) == (0.0, 0.0, 0.0)


def test_paired_difference_matches_the_normal_approximation():
    # 1000 questions; the ablation flips 60 right answers to wrong and 20 wrong to right:
    # d_i in {-1 (60x), +1 (20x), 0}: mean -4 points, sd from the hand formula.
    base = np.zeros(1000, dtype=bool)
    base[:500] = True
    run = base.copy()
    run[:60] = False
    run[500:520] = True
    d = np.r_[-np.ones(60), np.ones(20), np.zeros(920)] * 100
    half = 1.96 * d.std() / np.sqrt(1000)
    ci = difference_interval(run, base, n_resamples=4000, seed=0)
    assert ci.estimate == pytest.approx(-4.0)
    assert ci.low == pytest.approx(-4.0 - half, abs=0.3)
    assert ci.high == pytest.approx(-4.0 + half, abs=0.3)


def test_questions_to_resolve_gives_an_interval_of_the_tolerance_width():
    # At the n it returns, scipy's Wald/Wilson interval has full width close to the tolerance.
    n = questions_to_resolve(37.5, 2.0)
    width = np.diff(stats.binomtest(round(0.375 * n), n).proportion_ci(method="wilson"))[0]
    assert 100 * width == pytest.approx(2.0, rel=0.01)


def test_batched_crossing_equals_the_scalar_function_on_random_curves():
    rng = np.random.default_rng(5)
    for k in (1, 2, 3, 6):
        xs = np.sort(rng.integers(0, 8, size=k)).astype(float)  # ties in x on purpose
        ys = rng.integers(45, 52, size=(300, k)).astype(float)  # integer: many exact touches
        line = rng.integers(46, 51, size=300).astype(float)
        got = max_fraction_within_batch(xs, ys, line)
        want = [max_fraction_within(np.column_stack([xs, y]), b + 1.0, 1.0) for y, b in zip(ys, line)]
        np.testing.assert_allclose(got, want)


def test_curve_intervals_equal_a_slow_resampling_loop():
    rng = np.random.default_rng(2)
    n = 40
    base = (rng.random(n) < 0.6) * 100.0
    runs = [(x, (rng.random(n) < 0.6 - x / 50) * 100.0) for x in (7.0, 0.5, 3.0, 12.0)]
    idx = bootstrap_indices(n, 300, seed=4)
    frame = curve_intervals({"s": runs}, base, 1.0, indices=idx).iloc[0]
    within, auc = [], []
    for row in idx:  # resample, rebuild the curve, take the statistic: the definition itself
        pts = [(x, v[row].mean()) for x, v in runs]
        # A resample whose curve never reaches its line counts as its bound, the largest x (12).
        within.append(max_fraction_within(pts, base[row].mean(), 1.0, if_never_crosses="max_x"))
        auc.append(normalized_auc(pts))
    assert frame["max_pct_within_low"] == pytest.approx(np.quantile(within, 0.025))
    assert frame["max_pct_within_high"] == pytest.approx(np.quantile(within, 0.975))
    assert frame["auc_low"] == pytest.approx(np.quantile(auc, 0.025))
    assert frame["auc_high"] == pytest.approx(np.quantile(auc, 0.975))
    pts = [(x, v.mean()) for x, v in runs]
    assert frame["max_pct_within"] == pytest.approx(max_fraction_within(pts, base.mean(), 1.0))
    assert frame["normalized_auc"] == pytest.approx(normalized_auc(pts))


def test_curve_intervals_refuse_runs_on_different_questions():
    with pytest.raises(ValueError, match="same questions"):
        curve_intervals({"s": [(1.0, np.ones(5))]}, np.ones(6))


def test_choice_kl_matches_scipy_entropy_on_hand_examples():
    base = [[-1.0, -2.0, -3.0, -0.5], [-0.1, -2.3]]
    run = [[-1.5, -1.0, -3.0, -2.0], [-0.7, -0.7]]
    want = [
        stats.entropy(np.exp(b) / np.exp(b).sum(), np.exp(r) / np.exp(r).sum()) for b, r in zip(base, run)
    ]
    np.testing.assert_allclose(choice_kl(run, base), want, rtol=1e-12)
    # By hand: p = (1/2, 1/2), q = softmax(0, -1); KL = sum p ln(p / q).
    p = np.array([0.5, 0.5])
    q = np.exp([0.0, -1.0]) / np.exp([0.0, -1.0]).sum()
    hand = 0.5 * np.log(0.5 / q[0]) + 0.5 * np.log(0.5 / q[1])
    assert choice_kl([[0.0, -1.0]], [[-3.0, -3.0]])[0] == pytest.approx(hand)
    # Adding a constant to every choice (a longer shared context) changes nothing.
    assert choice_kl([[5.0, 4.0]], [[-3.0, -3.0]])[0] == pytest.approx(hand)
    assert choice_kl(base, base) == pytest.approx([0.0, 0.0])


def test_answer_agreement_and_chosen_answers_by_hand():
    base = [[-1.0, -2.0], [-3.0, -1.0, -2.0], [-1.0, -1.0]]
    run = [[-2.0, -1.0], [-3.0, -0.5, -2.0], [-1.0, -1.0]]
    assert chosen_answers(base).tolist() == [0, 1, 0]  # first of a tie, as lm-eval's argmax
    assert answer_agreement(run, base).tolist() == [False, True, True]
