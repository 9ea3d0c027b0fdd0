import numpy as np
import pandas as pd
import pytest
import torch

from inactive_heads.analysis import (
    auc_table,
    flagged_mask,
    iou,
    max_fraction_table,
    max_fraction_within,
    normalized_auc,
    rank_by_auc,
    rank_table,
    spearman_between_models,
    table2,
    top_k,
    topk_iou,
    wasserstein,
    wasserstein_matrix,
)
from inactive_heads.scoring.recording import HeadScores

# ---- max_fraction_within ------------------------------------------------------------------


def test_crossing_in_the_middle_is_interpolated():
    # line = 60 - 1 = 59; segment (10, 60) -> (20, 56) crosses at 10 + (59-60)/(56-60)*10 = 12.5
    pts = [(0, 60.0), (10, 60.0), (20, 56.0), (30, 50.0)]
    assert max_fraction_within(pts, 60.0) == pytest.approx(12.5)
    # tolerance 2: line 58 -> 10 + (58-60)/(56-60)*10 = 15
    assert max_fraction_within(pts, 60.0, tolerance=2.0) == pytest.approx(15.0)


def test_several_crossings_take_the_last():
    # line 49: down across at 5 (50->48 over 0..10), back up at 15 (48->50 over 10..20),
    # down again at 25 + 0.5*... : segment (20,50)->(30,46): 20 + (49-50)/(46-50)*10 = 22.5
    pts = [(0, 50.0), (10, 48.0), (20, 50.0), (30, 46.0)]
    assert max_fraction_within(pts, 50.0) == pytest.approx(22.5)
    # Last crossing is an up-crossing: still the answer (mirrors the notebook).
    pts_up = [(0, 50.0), (10, 47.0), (20, 51.0)]
    assert max_fraction_within(pts_up, 50.0) == pytest.approx(10 + 2 / 4 * 10)


def test_never_crossing_gives_zero():
    above = [(0, 60.0), (5, 59.8), (10, 59.5)]
    assert max_fraction_within(above, 60.0) == 0.0
    assert max_fraction_within(above, 60.0, if_never_crosses="max_x") == 10.0
    below = [(0, 40.0), (5, 30.0)]
    assert max_fraction_within(below, 60.0) == 0.0
    assert max_fraction_within(below, 60.0, if_never_crosses="max_x") == 0.0


def test_crossing_exactly_at_a_point():
    # (20, 49) lies exactly on the line 50 - 1; the curve then stays below.
    pts = [(0, 50.0), (10, 49.5), (20, 49.0), (30, 40.0)]
    assert max_fraction_within(pts, 50.0) == 20.0
    # Touching the line and bouncing back up still counts as a crossing at that x.
    touch = [(0, 50.0), (10, 49.0), (20, 50.0)]
    assert max_fraction_within(touch, 50.0) == 10.0
    # The first point on the line.
    assert max_fraction_within([(0, 49.0), (10, 40.0)], 50.0) == 0.0
    assert max_fraction_within([(3, 49.0), (10, 40.0)], 50.0) == 3.0


def test_unsorted_input_is_sorted_by_x():
    pts = [(30, 50.0), (0, 60.0), (20, 56.0), (10, 60.0)]
    assert max_fraction_within(pts, 60.0) == pytest.approx(12.5)
    assert max_fraction_within(np.array(pts), 60.0) == pytest.approx(12.5)


def test_notebook_curve_llama_3b_ahon_ln():
    # Llama-3.2-3B AHON (LN) points from the authors' notebook; baseline = Random p=0.
    pts = [
        (0.0, 56.152969662441244),
        (4.805830912457741, 56.16721264777097),
        (7.967133428469497, 55.28414755732801),
        (9.781760188913239, 53.56786782509614),
        (11.459649949883628, 52.39282153539382),
        (15.533686271511819, 48.718131320324744),
        (20.43653271155055, 39.531405782652044),
    ]
    base = 56.202820111095285
    # The line 55.2028 is crossed (for the last time) between the 3rd and 4th points; numpy's
    # linear interpolation of x over that falling segment (ys reversed to be increasing) gives
    # the expected x independently of the code under test.
    (x1, y1), (x2, y2) = pts[2], pts[3]
    expected = float(np.interp(base - 1, [y2, y1], [x2, x1]))
    assert max_fraction_within(pts, base) == pytest.approx(expected, rel=1e-12)
    assert 8.0 < expected < 8.1


def test_bad_points():
    with pytest.raises(ValueError, match="at least one"):
        max_fraction_within([], 50.0)
    with pytest.raises(ValueError, match="pairs"):
        max_fraction_within([(1, 2, 3)], 50.0)
    with pytest.raises(ValueError, match="NaN"):
        normalized_auc([(0, 1.0), (1, float("nan"))])
    with pytest.raises((ValueError, TypeError), match="if_never_crosses"):
        max_fraction_within([(0, 1.0)], 1.0, if_never_crosses="maybe")


# ---- AUC and ranking ------------------------------------------------------------------------


def test_normalized_auc_by_hand():
    # trapezoids: (0..10) (60+50)/2*10 = 550; (10..20) (50+30)/2*10 = 400; span 20 -> 47.5
    assert normalized_auc([(20, 30.0), (0, 60.0), (10, 50.0)]) == pytest.approx(47.5)
    # uneven spacing: (2..4) (40+20)/2*2 = 60; (4..12) (20+20)/2*8 = 160; span 10 -> 22
    assert normalized_auc([(2, 40.0), (4, 20.0), (12, 20.0)]) == pytest.approx(22.0)
    # zero span: plain mean
    assert normalized_auc([(5, 10.0), (5, 20.0)]) == pytest.approx(15.0)
    assert normalized_auc([(5, 10.0)]) == pytest.approx(10.0)


def test_rank_by_auc_descending():
    curves = {
        "a": [(0, 50.0), (10, 40.0)],  # 45
        "b": [(0, 50.0), (10, 50.0)],  # 50
        "c": [(0, 50.0), (20, 30.0)],  # 40
    }
    ranked = rank_by_auc(curves)
    assert [k for k, _ in ranked] == ["b", "a", "c"]
    assert ranked[0][1] == pytest.approx(50.0)


def _results():
    results = {
        "m1": {
            "awft": [(0, 60.0), (10, 60.0), (20, 56.0)],  # 12.5
            "ahon_ln": [(0, 60.0), (20, 59.5), (30, 55.0)],  # 20 + (59-59.5)/(55-59.5)*10 = 21.11
            "random": [(0, 60.0), (10, 50.0)],  # 1.0
        },
        "m2": {
            "awft": [(0, 50.0), (30, 49.5)],  # never crosses -> 0
            "awft_ln": [(0, 50.0), (10, 48.0)],  # 5
            "random": [(0, 50.0), (10, 40.0)],  # 1
        },
    }
    return results, {"m1": 60.0, "m2": 50.0}


def test_table2():
    results, baselines = _results()
    df = table2(results, baselines)
    assert list(df.columns) == ["model", "awft_max_pct", "awft_censored", "best_other_key", "best_other_max_pct",
                                "best_other_censored", "delta"]
    r1, r2 = df.iloc[0], df.iloc[1]
    assert r1["awft_max_pct"] == pytest.approx(12.5)
    assert r1["best_other_key"] == "ahon_ln"
    assert r1["best_other_max_pct"] == pytest.approx(20 + 0.5 / 4.5 * 10)
    assert r2["awft_max_pct"] == 0.0
    assert r2["best_other_key"] == "awft_ln"  # AWFT (LN) counts as "other"
    assert r2["delta"] == pytest.approx(5.0)
    with_mean = table2(results, baselines, mean_row=True)
    assert len(with_mean) == 3 and with_mean.iloc[-1]["model"] == "mean"
    assert with_mean.iloc[-1]["best_other_max_pct"] == pytest.approx((r1["best_other_max_pct"] + 5.0) / 2)
    with pytest.raises(ValueError, match="no baseline"):
        table2(results, {"m1": 60.0})
    with pytest.raises(ValueError, match="no 'aeqd' curve"):
        table2(results, baselines, sink_key="aeqd")
    full = max_fraction_table(results, baselines)
    assert full.loc["m1", "random"] == pytest.approx(1.0)
    assert np.isnan(full.loc["m1", "awft_ln"])


def test_auc_tables_spearman_topk():
    auc = {
        "m1": {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0},
        "m2": {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0},
        "m3": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0},
    }
    rho = spearman_between_models(auc)
    assert rho.loc["m1", "m2"] == pytest.approx(1.0)
    assert rho.loc["m1", "m3"] == pytest.approx(-1.0)
    # Not just ±1: ranks (1, 3, 2, 4) vs (1, 2, 3, 4): 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8.
    rho4 = spearman_between_models({**auc, "m4": {"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0}})
    assert rho4.loc["m4", "m1"] == pytest.approx(0.8) and rho4.loc["m3", "m4"] == pytest.approx(-0.8)
    assert np.isnan(spearman_between_models({"x": {"a": 1.0, "b": 2.0}, "y": {"a": 2.0, "b": 1.0}}).loc["x", "y"])
    assert top_k(auc["m1"], 2) == ["d", "c"]
    ious = topk_iou(auc, k=2)
    assert ious.loc["m1", "m2"] == 1.0
    assert ious.loc["m1", "m3"] == 0.0
    assert topk_iou(auc, k=3).loc["m1", "m3"] == pytest.approx(2 / 4)
    ranks = rank_table(auc)
    assert ranks.loc["m1", "d"] == 1 and ranks.loc["m3", "a"] == 1
    assert ranks.loc["mean_rank", "a"] == pytest.approx((4 + 4 + 1) / 3)
    results, _ = _results()
    table = auc_table(results)
    assert table.loc["m1", "random"] == pytest.approx(55.0)
    assert isinstance(spearman_between_models(table), pd.DataFrame)


# ---- masks and IoU --------------------------------------------------------------------------


def test_iou_by_hand():
    a = torch.tensor([[True, True, False, False]])
    b = torch.tensor([[True, False, True, False]])
    assert iou(a, b) == pytest.approx(1 / 3)
    assert iou(a, a) == 1.0
    none = torch.zeros(1, 4, dtype=torch.bool)
    assert iou(none, none) == 1.0
    assert iou(a, none) == 0.0
    assert iou(a.numpy(), b.numpy()) == pytest.approx(1 / 3)


def test_iou_errors():
    a = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises((ValueError, TypeError)):  # jaxtyping's shape check fires first under pytest
        iou(a, torch.zeros(3, 2, dtype=torch.bool))


def test_flagged_mask_directions():
    t = torch.tensor([0.1, 0.5, 0.9]).reshape(1, 1, 3)
    hs = HeadScores({"ahon_ln": t, "awft": t})
    assert flagged_mask(hs, "ahon_ln", 0.5).flatten().tolist() == [True, False, False]
    assert flagged_mask(hs, "awft", 0.5).flatten().tolist() == [False, False, True]
    assert flagged_mask(t, "x", 0.5, "above").flatten().tolist() == [False, False, True]
    with pytest.raises(ValueError, match="not registered"):
        flagged_mask(t, "x", 0.5)


# ---- Wasserstein ------------------------------------------------------------------------------


def test_wasserstein_by_hand_identity_symmetry():
    a = torch.tensor([0.0, 1.0]).reshape(2, 1, 1)
    b = torch.tensor([1.0, 2.0]).reshape(1, 1, 2)  # different shape is fine: pools are compared
    assert wasserstein(a, b, "ahon_ln") == pytest.approx(1.0)
    assert wasserstein(b, a, "ahon_ln") == pytest.approx(1.0)
    # {0, 1} vs {0, 0, 3}: the CDFs differ by |1/2 - 2/3| on [0, 1) and by |1 - 2/3| on [1, 3)
    c = torch.tensor([0.0, 0.0, 3.0]).reshape(3, 1, 1)
    assert wasserstein(a, c, "ahon_ln") == pytest.approx(1 / 6 + 2 / 3)
    gen = torch.Generator().manual_seed(0)
    hs = HeadScores({"ahon_ln": torch.rand(5, 3, 4, generator=gen)})
    assert wasserstein(hs, hs, "ahon_ln") == 0.0


def test_wasserstein_matrix():
    named = {
        "x": HeadScores({"awft": torch.tensor([0.0, 1.0]).reshape(2, 1, 1)}),
        "y": HeadScores({"awft": torch.tensor([1.0, 2.0]).reshape(2, 1, 1)}),
        "z": HeadScores({"awft": torch.tensor([3.0, 4.0]).reshape(1, 2, 1)}),
    }
    m = wasserstein_matrix(named, "awft")
    assert list(m.index) == ["x", "y", "z"]
    assert m.loc["x", "y"] == pytest.approx(1.0)
    assert m.loc["x", "z"] == pytest.approx(3.0)
    assert m.loc["z", "y"] == pytest.approx(2.0)


def test_wasserstein_rejects_non_finite():
    bad = torch.tensor([0.0, float("nan")]).reshape(2, 1, 1)
    with pytest.raises(ValueError, match="'awft': 1 of 2 values are NaN/inf"):
        wasserstein(bad, bad, "awft")


def test_one_strict_inactive_comparison_everywhere():
    # A value exactly at τ is never inactive; below/above by the score's direction. The ablation
    # (ScoreFunction.is_inactive), the calibration's flagged fraction and the analysis mask agree.
    from inactive_heads.scoring.calibration import flag_fraction
    from inactive_heads.scoring.scores import get_score

    t = torch.tensor([0.5, 0.5, 0.2, 0.8]).reshape(1, 1, 4)
    hs = HeadScores({"ahon_ln": t, "awft": t})
    assert flagged_mask(hs, "ahon_ln", 0.5).flatten().tolist() == [False, False, True, False]
    assert flagged_mask(hs, "awft", 0.5).flatten().tolist() == [False, False, False, True]
    assert get_score("ahon_ln").is_inactive(t, 0.5).flatten().tolist() == [False, False, True, False]
    assert get_score("awft").is_inactive(t, 0.5).flatten().tolist() == [False, False, False, True]
    assert flag_fraction(hs, "ahon_ln", 0.5) == 0.25 and flag_fraction(hs, "awft", 0.5) == 0.25
