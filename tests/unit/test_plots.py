"""Structure of the plotly figures (traces, axes, shapes, data), not their bytes."""

import numpy as np
import plotly.io as pio
import pytest
import torch
from synthetic_sweep import write_synthetic_sweep

from inactive_heads.reporting import plots
from inactive_heads.scoring.calibration import calibrate
from inactive_heads.scoring.recording import HeadScores
from inactive_heads.sweep.results import SweepResults

L, H, N = 4, 3, 5


@pytest.fixture
def hs() -> HeadScores:
    gen = torch.Generator().manual_seed(1)
    return HeadScores(
        {"ahon_ln": torch.rand(N, L, H, generator=gen) * 2, "awft": torch.rand(N, L, H, generator=gen)},
        {"model": "x"},
    )


@pytest.fixture
def sweep(tmp_path) -> SweepResults:
    return SweepResults.load(write_synthetic_sweep(tmp_path / "sweep"))


def test_score_heatmap_mean_layout(hs):
    fig = plots.score_heatmap(hs, "ahon_ln")
    assert [t.type for t in fig.data] == ["heatmap"]
    heat = fig.data[0]
    np.testing.assert_allclose(np.asarray(heat.z), hs.mean("ahon_ln").double().numpy(), rtol=1e-6)
    assert np.asarray(heat.z).shape == (L, H)
    assert list(heat.x) == list(range(H)) and list(heat.y) == list(range(L))
    assert fig.layout.xaxis.title.text == "head"
    assert fig.layout.yaxis.title.text == "layer"
    y0, y1 = fig.layout.yaxis.range
    assert y0 > y1  # reversed: layer 0 at the top
    assert "AHON (LN)" in heat.hovertemplate and "layer" in heat.hovertemplate
    assert fig.layout.showlegend is False


@pytest.mark.parametrize("key, tau", [("ahon_ln", 1.0), ("awft", 0.5)])
def test_score_heatmap_outlines_flagged_heads(hs, key, tau):
    fig = plots.score_heatmap(hs, key, threshold=tau)
    assert [t.type for t in fig.data] == ["heatmap", "scatter"]
    mean = hs.mean(key)
    expected = mean > tau if key == "awft" else mean < tau
    outline = fig.data[1]
    assert len(outline.x) == int(expected.sum())
    assert {(y, x) for x, y in zip(outline.x, outline.y)} == {tuple(i) for i in expected.nonzero().tolist()}
    assert outline.marker.symbol == "square-open"
    assert f"{int(expected.sum())} of {L * H}" in outline.name
    assert fig.layout.showlegend is True


def test_score_heatmap_one_sequence(hs):
    fig = plots.score_heatmap(hs, "awft", sequence=2, threshold=0.5, title="t")
    np.testing.assert_allclose(np.asarray(fig.data[0].z), hs["awft"][2].double().numpy(), rtol=1e-6)
    assert len(fig.data[1].x) == int((hs["awft"][2] > 0.5).sum())
    assert fig.layout.title.text == "t"
    with pytest.raises(IndexError, match="out of range"):
        plots.score_heatmap(hs, "awft", sequence=N)


def test_flag_rate_heatmap(hs):
    fig = plots.flag_rate_heatmap(hs, "ahon_ln", 1.0)
    assert [t.type for t in fig.data] == ["heatmap"]
    expected = 100 * (hs["ahon_ln"] < 1.0).double().mean(dim=0)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), expected.numpy())
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0, 100)
    assert fig.layout.xaxis.title.text == "head" and fig.layout.yaxis.title.text == "layer"


def test_layer_profiles(hs):
    fig = plots.layer_profiles(hs)
    assert len(fig.data) == 2 * len(hs.keys())
    assert [a.text for a in fig.layout.annotations] == ["AHON (LN)", "AWFT"]
    points, line = fig.data[0], fig.data[1]
    assert points.mode == "markers" and line.mode == "lines"
    assert len(points.y) == L * H
    np.testing.assert_allclose(points.y, hs.mean("ahon_ln").double().numpy().ravel())
    np.testing.assert_allclose(line.y, hs.mean("ahon_ln").double().mean(dim=1).numpy())
    assert fig.layout.xaxis.title.text == "layer" and fig.layout.xaxis2.title.text == "layer"
    assert points.marker.color == plots.score_color("ahon_ln")
    one = plots.layer_profiles(hs, ["awft"])
    assert len(one.data) == 2 and one.layout.annotations[0].text == "AWFT"
    with pytest.raises(KeyError, match="aeqd"):
        plots.layer_profiles(hs, ["aeqd"])


def test_accuracy_curves_from_dict():
    curves = {"ahon_ln": [(10.0, 49.0), (0.0, 50.0), (20.0, 47.0)], "awft": [(0, 50), (5, 48)]}
    fig = plots.accuracy_curves(curves, baseline=50.0, tolerance=1.0)
    assert [t.type for t in fig.data] == ["scatter", "scatter"]
    assert [t.name for t in fig.data] == ["AHON (LN)", "AWFT"]
    assert all(t.mode == "lines+markers" for t in fig.data)
    assert list(fig.data[0].x) == [0.0, 10.0, 20.0]  # sorted by realized %
    assert list(fig.data[0].y) == [50.0, 49.0, 47.0]
    assert [(s.y0, s.y1) for s in fig.layout.shapes] == [(50.0, 50.0), (49.0, 49.0)]
    texts = [a.text for a in fig.layout.annotations]
    assert any("baseline 50.00%" in t for t in texts) and any("− 1 pt" in t for t in texts)
    assert fig.layout.xaxis.title.text == "% of heads zeroed (realized)"
    assert fig.layout.yaxis.title.text == "accuracy (%)"
    assert fig.data[0].line.dash == "solid" and fig.data[1].line.dash == "dash"

    no_base = plots.accuracy_curves(curves)
    assert len(no_base.layout.shapes) == 0


def test_accuracy_curves_from_sweep(sweep):
    fig = plots.accuracy_curves(sweep, tolerance=2.0)
    curves = sweep.curves()
    assert [t.name for t in fig.data] == ["AHON (LN)", "AWFT", "AEQD", "Random"]
    for trace, key in zip(fig.data, curves):
        assert list(zip(trace.x, trace.y)) == curves[key]
        assert trace.line.color == plots.score_color(key)
    assert [s.y0 for s in fig.layout.shapes] == [50.0, 48.0]
    assert "p = 30%" in fig.data[0].customdata[-1]
    assert "toy-model" in fig.layout.title.text


def test_auc_ranking(sweep):
    """The synthetic sweep's curves are straight lines from (0 %, 50 %): score i zeroes (i + 1)·100·p %
    at p = 0 ... 30 % and loses 0.05·(i + 1) points per % (Random: p %, 1 point per %). The normalized
    AUC of a straight line is the mean of its two ends: AHON (LN) (50 + 48.5)/2, AWFT (50 + 44)/2,
    AEQD (50 + 36.5)/2, Random (50 + 20)/2."""
    fig = plots.auc_ranking(sweep)
    assert list(fig.data[0].y) == ["AHON (LN)", "AWFT", "AEQD", "Random"]
    np.testing.assert_allclose(fig.data[0].x, [49.25, 47.0, 43.25, 35.0], rtol=1e-12)
    assert [s.x0 for s in fig.layout.shapes] == [50.0]


def test_score_distributions_ecdf_with_thresholds(hs):
    t = calibrate(hs, "ahon_ln")
    fig = plots.score_distributions(hs, "ahon_ln", thresholds=t)
    assert [tr.type for tr in fig.data] == ["scatter"]
    x, y = np.asarray(fig.data[0].x), np.asarray(fig.data[0].y)
    assert len(x) == N * L * H and np.all(np.diff(x) >= 0)
    assert y[-1] == pytest.approx(1.0) and y[0] == pytest.approx(1 / (N * L * H))
    assert sorted(s.x0 for s in fig.layout.shapes) == pytest.approx(sorted(t.values))
    assert fig.layout.xaxis.title.text == "AHON (LN)"
    assert "x" in fig.data[0].name  # the model name from metadata

    floats = plots.score_distributions(hs, "ahon_ln", thresholds=[0.5, 1])
    assert [s.x0 for s in floats.layout.shapes] == [0.5, 1.0]


def test_score_distributions_several_models_histogram(hs):
    other = HeadScores({"ahon_ln": hs["ahon_ln"] * 1.5}, {"model": "y"})
    fig = plots.score_distributions({"a": hs, "b": other}, "ahon_ln", kind="histogram")
    assert [tr.type for tr in fig.data] == ["histogram", "histogram"]
    assert [tr.name.split(" ")[0] for tr in fig.data] == ["a", "b"]
    assert fig.data[0].marker.color != fig.data[1].marker.color
    assert fig.layout.yaxis.title.text == "density"
    with pytest.raises(ValueError, match="kind"):
        plots.score_distributions(hs, "ahon_ln", kind="kde")


def test_score_distributions_subsamples_large_pools():
    big = HeadScores({"awft": torch.rand(50, 20, 30, generator=torch.Generator().manual_seed(0))})
    fig = plots.score_distributions(big, "awft")
    x, y = np.asarray(fig.data[0].x), np.asarray(fig.data[0].y)
    assert len(x) <= plots.MAX_POINTS
    pool = big["awft"].double().flatten()
    assert x[0] == pytest.approx(float(pool.min())) and x[-1] == pytest.approx(float(pool.max()))
    assert y[-1] == 1.0
    again = plots.score_distributions(big, "awft")
    assert np.array_equal(np.asarray(again.data[0].x), x)  # deterministic


def test_wasserstein_heatmap(hs):
    other = HeadScores({"ahon_ln": hs["ahon_ln"] + 0.25, "awft": hs["awft"]}, {"model": "y"})
    fig = plots.wasserstein_heatmap({"a": hs, "b": other}, "ahon_ln")
    z = np.asarray(fig.data[0].z)
    # A shift by 0.25 moves every quantile by 0.25: W1 = 0.25 (and 0 from a pool to itself).
    assert z.shape == (2, 2)
    assert z[0, 1] == pytest.approx(0.25, rel=1e-5) and z[1, 0] == pytest.approx(0.25, rel=1e-5)
    assert np.asarray(fig.data[0].text).shape == (2, 2) and fig.data[0].texttemplate == "%{text}"
    assert list(fig.data[0].x) == ["a", "b"]


def test_iou_heatmap():
    # One sequence, one layer, four heads. AHON (LN) < 1 flags heads {0, 1}; AWFT > 0.5 flags
    # {0, 2}; LTHON (LN) < 0 flags nothing. By hand: IoU({0,1}, {0,2}) = 1/3, IoU(A, A) = 1,
    # IoU(A, {}) = 0, IoU({}, {}) = 1 (two empty selections agree).
    small = HeadScores({
        "ahon_ln": torch.tensor([0.1, 0.5, 2.0, 3.0]).reshape(1, 1, 4),
        "awft": torch.tensor([0.9, 0.1, 0.8, 0.2]).reshape(1, 1, 4),
        "lthon_ln": torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 4),
    })
    fig = plots.iou_heatmap(small, {"ahon_ln": 1.0, "awft": 0.5, "lthon_ln": 0.0})
    np.testing.assert_allclose(np.asarray(fig.data[0].z), [[1, 1 / 3, 0], [1 / 3, 1, 0], [0, 0, 1]])
    assert list(fig.data[0].x) == ["AHON (LN)", "AWFT", "LTHON (LN)"]
    assert np.asarray(fig.data[0].text)[0, 1] == "0.33"


def test_realized_by_layer(sweep):
    fig = plots.realized_by_layer(sweep, "awft")
    records = sorted((r for r in sweep.records.values() if r.score == "awft"), key=lambda r: r.p)
    assert len(fig.data) == len(records) == 7
    for trace, rec in zip(fig.data, records):
        np.testing.assert_allclose(trace.y, [100 * f for f in rec.realized_fraction_per_layer])
        assert list(trace.x) == list(range(4))
        assert trace.name.startswith(f"p = {rec.p:.0%}")
    assert fig.layout.xaxis.title.text == "layer"
    assert fig.layout.yaxis.title.text == "% of heads zeroed"
    with pytest.raises(ValueError, match="not part of this sweep"):
        plots.realized_by_layer(sweep, "avvn")


def test_realized_by_layer_without_per_layer_data(tmp_path):
    import json

    path = write_synthetic_sweep(tmp_path / "s", scores=["ahon_ln"], include_random=False)
    for f in (path / "runs").glob("ahon_ln*.json"):
        rec = json.loads(f.read_text())
        rec["realized_fraction_per_layer"] = []
        f.write_text(json.dumps(rec))
    fig = plots.realized_by_layer(SweepResults.load(path), "ahon_ln")
    assert len(fig.data) == 0 and "no finished run" in fig.layout.annotations[0].text


def test_colors_and_styles_are_stable():
    assert plots.score_color("ahon_ln") == plots.score_color("ahon")  # one family, one color
    assert plots.score_color("ahon_ln") != plots.score_color("awft_ln")
    # An unregistered key's color must not come from Python's hash(), which is salted per
    # process (two reports of one sweep would disagree): with hash() replaced, nothing changes.
    import builtins

    before = {k: plots.score_color(k) for k in (f"custom_{i}" for i in range(20))}
    real_hash = builtins.hash
    try:
        builtins.hash = lambda obj: 0
        assert {k: plots.score_color(k) for k in before} == before
    finally:
        builtins.hash = real_hash
    assert len(set(before.values())) >= 4  # different keys spread over the palette
    assert [plots.score_dash(k) for k in ("ahon_ln", "ahon", "lthon_hn", "random")] == ["solid", "dash", "dot", "dot"]


def test_every_figure_uses_the_template(hs, sweep):
    figs = [
        plots.score_heatmap(hs, "ahon_ln"),
        plots.layer_profiles(hs),
        plots.accuracy_curves(sweep),
        plots.score_distributions(hs, "awft"),
        plots.wasserstein_heatmap({"a": hs}, "awft"),
        plots.iou_heatmap(hs, {"awft": 0.5}),
        plots.realized_by_layer(sweep, "ahon_ln"),
        plots.auc_ranking(sweep),
        plots.flag_rate_heatmap(hs, "awft", 0.5),
    ]
    for fig in figs:
        assert fig.layout.template == pio.templates[plots.TEMPLATE]
        assert fig.layout.height and fig.layout.height > 200


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(plots, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
