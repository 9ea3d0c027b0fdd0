"""Summaries of ablation curves (pure numpy/pandas/scipy; no model needed).

A *curve* is a list of ``(percent_zeroed, accuracy_percent)`` points for one score function on
one model: the realized % of (sequence, layer, head) triples zeroed (x) and the benchmark
accuracy in % (y), one point per threshold τ_p. From these:

* :func:`max_fraction_within`: the paper's Table 2 statistic, the largest % of heads that can be
  zeroed while accuracy stays within ``tolerance`` points of the baseline (docs/concepts.md, "Summarizing a curve");
  :func:`max_fraction_within_censored` says when a curve never reached its line, so that the
  value is a lower bound (what the toolkit's tables show; the paper's rule counts it 0);
* :func:`normalized_auc` / :func:`rank_by_auc`: the Fig. 3 ranking (docs/concepts.md, "Summarizing a curve");
* :func:`table2`, :func:`max_fraction_table`, :func:`auc_table`, :func:`rank_table`,
  :func:`spearman_between_models`, :func:`topk_iou`: the same over several models.

The flagged heads and score distributions are in :mod:`.heads`, the bootstrap over questions in
:mod:`.bootstrap` and the paired comparisons with the baseline in :mod:`.paired`.
"""

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from ..scoring.calibration import Real
from ..core.errors import UserError

Points = Sequence[Sequence[Real]] | np.ndarray


def _curve(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """Points as float arrays (x, y) sorted by x (stable: ties keep their input order)."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.size == 0:
        raise UserError("a curve needs at least one (percent_zeroed, accuracy) point; got none")
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise UserError(f"points must be (percent_zeroed, accuracy) pairs; got an array of shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise UserError(f"points contain NaN/inf: {arr.tolist()}")
    order = np.argsort(arr[:, 0], kind="stable")
    return arr[order, 0], arr[order, 1]


# ----------------------------------------------------------------------------------------------
# One curve


class MaxWithin(NamedTuple):
    """The max % zeroed within tolerance of one curve, read with its censoring.

    ``value`` is where the curve last crosses the line (as :func:`max_fraction_within`), and
    otherwise:

    * ``censored`` (every point above the line: the curve never reached it in the tested range):
      ``value`` is the largest realized x, a **lower bound** of the truth ("≥ value, not reached:
      add larger quantiles");
    * ``below`` (every point below the line): ``value`` is 0.0; the truth is below the smallest
      tested x.

    >>> max_fraction_within_censored([(5, 40.0), (12, 39.5)], 40.0)
    MaxWithin(value=12.0, censored=True, below=False)
    """

    value: float
    censored: bool = False
    below: bool = False


def _never_reached(above_line: np.ndarray) -> np.ndarray:
    """Per curve (last axis: its points' distance above the line), for curves that do not cross:
    True when every point lies above the line, so the statistic is censored at the largest x.
    The one place the toolkit decides censoring (one curve and the bootstrap replicates alike)."""
    return np.asarray((np.asarray(above_line) > 0).all(axis=-1))


def max_fraction_within_censored(points: Points, baseline: Real, tolerance: Real = 1.0) -> MaxWithin:
    """Largest % zeroed with accuracy still within ``tolerance`` points of ``baseline``, with the
    censoring said (:class:`MaxWithin`): the crossing rule of :func:`max_fraction_within`; a
    curve that never falls to the line in the tested range gives its largest realized x flagged
    ``censored`` (a lower bound), one that lies below the line everywhere gives 0.0 flagged
    ``below``. This is the reading the sweep table, the report and ``grid`` show."""
    xs, ys = _curve(points)
    line = float(baseline) - float(tolerance)
    last: float | None = float(xs[0]) if ys[0] == line else None
    for i in range(len(xs) - 1):
        x1, x2, y1, y2 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        if (y1 - line) * (y2 - line) < 0:
            last = float(x1 + (line - y1) * (x2 - x1) / (y2 - y1))
        if y2 == line:
            last = float(x2)
    if last is not None:
        return MaxWithin(last)
    if bool(_never_reached(ys - line)):
        return MaxWithin(float(xs[-1]), censored=True)
    return MaxWithin(0.0, below=True)


def max_fraction_within(
    points: Points,
    baseline: Real,
    tolerance: Real = 1.0,
    *,
    if_never_crosses: Literal["zero", "max_x"] = "zero",
) -> float:
    """Largest % zeroed with accuracy still within ``tolerance`` points of ``baseline`` (Table 2).

    The points are sorted by x and joined into a piecewise-linear curve; the answer is the x of
    the **last** (largest-x) crossing of that curve with the line y = baseline − tolerance,
    following the authors' notebook (``get_intersection``):

    * a segment crosses where (y_i − line) and (y_{i+1} − line) have strictly opposite signs;
      the crossing x is linearly interpolated inside the segment;
    * a point lying exactly on the line is a crossing at its own x (so touching counts);
    * among all crossings the largest x wins (the last segment scanned), whichever way the curve
      passes through the line there;
    * no crossing at all gives 0.0: **the paper's rule**, the default, with which Table 2 is
      reproduced (:func:`table2`, :func:`max_fraction_table`).

    The no-crossing case arises when every point is above the line (the function never cost a
    full point of accuracy within its realized range: the curve is *censored*) or every point is
    below it. The notebook reports 0 for both. For "every point above", 0 understates the truth:
    the real answer is at least the largest realized x, which ``if_never_crosses="max_x"``
    returns instead (points all below still give 0.0); :func:`max_fraction_within_censored`
    returns the same number with the flag that says it is a bound.

    Tolerance is in absolute accuracy points (1.0 = "within 1%" of the paper). A single point is
    accepted (the notebook returned 0 for fewer than two points): it counts only if it lies on
    the line.
    """
    _check_rule(if_never_crosses)
    return _by_rule(max_fraction_within_censored(points, baseline, tolerance), if_never_crosses)


def _check_rule(if_never_crosses: str) -> None:
    if if_never_crosses not in ("zero", "max_x"):
        raise UserError(f"if_never_crosses={if_never_crosses!r} must be 'zero' or 'max_x'")


def _by_rule(reading: MaxWithin, if_never_crosses: str) -> float:
    """The number a rule gives for a reading: the paper's 0 for a censored curve under "zero"."""
    return 0.0 if reading.censored and if_never_crosses == "zero" else reading.value


def normalized_auc(points: Points) -> float:
    """Trapezoid area under accuracy vs % zeroed, divided by the curve's own x-span (Fig. 3).

    Each function's realized x-range differs, so this is the mean accuracy over that range. A
    curve whose points all share one x (span 0, e.g. a single point) gets the plain mean of its
    accuracies, the limit of the same quantity.
    """
    xs, ys = _curve(points)
    span = float(xs[-1] - xs[0])
    if span == 0.0:
        return float(ys.mean())
    return float(np.trapezoid(ys, xs) / span)


def auc_ranks(auc: Mapping[str, Real]) -> pd.Series:
    """The toolkit's one ranking rule, used by the sweep table, the report, ``grid`` and
    ``report --compare``: by normalized AUC, larger first; equal AUCs share the best of their
    ranks (competition ranking: 1, 2, 2, 4); a score without an AUC (NaN) has no rank (NaN).
    Listings put tied scores in the order of their keys (the sweep's score order).

    >>> auc_ranks({"a": 0.5, "b": 0.9, "c": 0.5, "d": 0.1}).tolist()
    [2.0, 1.0, 2.0, 4.0]
    """
    return pd.Series(dict(auc), dtype=float).rank(ascending=False, method="min")


def rank_by_auc(curves: Mapping[str, Points]) -> list[tuple[str, float]]:
    """``[(key, normalized AUC), ...]``, best (largest) first; ties keep the input order
    (the listing order of :func:`auc_ranks`)."""
    scored = [(key, normalized_auc(pts)) for key, pts in curves.items()]
    return sorted(scored, key=lambda kv: -kv[1])


# ----------------------------------------------------------------------------------------------
# Several models: results[model][score_key] = points


def max_fraction_table(
    results: Mapping[str, Mapping[str, Points]],
    baselines: Mapping[str, Real],
    tolerance: Real = 1.0,
    *,
    if_never_crosses: Literal["zero", "max_x"] = "zero",
) -> pd.DataFrame:
    """:func:`max_fraction_within` for every (model, score): models as rows, scores as columns
    (NaN where a model lacks a score). The default is the paper's rule (0 for a curve that never
    crosses its line); ``if_never_crosses="max_x"`` gives such a curve its lower bound instead."""
    _check_rule(if_never_crosses)
    missing = [m for m in results if m not in baselines]
    if missing:
        raise UserError(f"no baseline accuracy for {missing}; baselines has {list(baselines)}")
    rows = {
        model: {key: max_fraction_within(pts, baselines[model], tolerance, if_never_crosses=if_never_crosses)
                for key, pts in curves.items()}
        for model, curves in results.items()
    }
    return pd.DataFrame.from_dict(rows, orient="index")


def table2(
    results: Mapping[str, Mapping[str, Points]],
    baselines: Mapping[str, Real],
    tolerance: Real = 1.0,
    sink_key: str = "awft",
    *,
    mean_row: bool = False,
    if_never_crosses: Literal["zero", "max_x"] = "zero",
) -> pd.DataFrame:
    """The paper's Table 2: per model, the max % zeroed within ``tolerance`` points of the
    baseline for ``sink_key`` (AWFT) and for the best of **all other** scores in ``results``
    (Random and AWFT (LN) included; docs/concepts.md, "Summarizing a curve").

    Columns: ``model``, ``<sink_key>_max_pct``, ``<sink_key>_censored``, ``best_other_key``,
    ``best_other_max_pct``, ``best_other_censored``, ``delta`` (best other − sink). Ties for best
    other go to the first key in ``results`` order. ``baselines[model]`` is the accuracy with
    nothing zeroed (the paper used its Random p = 0 run). ``mean_row=True`` appends a
    ``model="mean"`` row averaging the numeric columns (the headline number is the mean of
    ``best_other_max_pct``; its flags say whether any row is censored).

    The default, ``if_never_crosses="zero"``, is **the paper's rule**, which reproduces Table 2: a
    curve that never crosses its line counts 0. The ``_censored`` columns say which curves never
    reached it in the tested range (every point above the line); ``if_never_crosses="max_x"``
    gives them their lower bound (the largest realized %) instead, and picks the best other score
    by that value-or-bound (:func:`max_fraction_within_censored`).
    """
    _check_rule(if_never_crosses)
    rows = []
    for model, curves in results.items():
        if sink_key not in curves:
            raise UserError(f"model '{model}' has no '{sink_key}' curve; it has {list(curves)}")
        if model not in baselines:
            raise UserError(f"no baseline accuracy for '{model}'; baselines has {list(baselines)}")
        base = baselines[model]
        sink_reading = max_fraction_within_censored(curves[sink_key], base, tolerance)
        sink = _by_rule(sink_reading, if_never_crosses)
        best_key, best, best_censored = None, float("nan"), False
        for key, pts in curves.items():
            if key == sink_key:
                continue
            reading = max_fraction_within_censored(pts, base, tolerance)
            value = _by_rule(reading, if_never_crosses)
            if best_key is None or value > best:
                best_key, best, best_censored = key, value, reading.censored
        rows.append(
            {
                "model": model,
                f"{sink_key}_max_pct": sink,
                f"{sink_key}_censored": sink_reading.censored,
                "best_other_key": best_key,
                "best_other_max_pct": best,
                "best_other_censored": best_censored,
                "delta": best - sink,
            }
        )
    columns = ["model", f"{sink_key}_max_pct", f"{sink_key}_censored", "best_other_key", "best_other_max_pct",
               "best_other_censored", "delta"]
    df = pd.DataFrame(rows, columns=columns)
    if mean_row and len(df):
        numeric = [f"{sink_key}_max_pct", "best_other_max_pct", "delta"]
        flags = [f"{sink_key}_censored", "best_other_censored"]
        mean = {"model": "mean", "best_other_key": None, **{c: float(df[c].mean()) for c in numeric},
                **{c: bool(df[c].any()) for c in flags}}
        df = pd.concat([df, pd.DataFrame([mean], columns=df.columns)], ignore_index=True)
    return df


def auc_table(results: Mapping[str, Mapping[str, Points]]) -> pd.DataFrame:
    """Normalized AUC for every (model, score): models as rows, scores as columns."""
    rows = {model: {key: normalized_auc(pts) for key, pts in curves.items()} for model, curves in results.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def rank_table(auc: pd.DataFrame | Mapping[str, Mapping[str, Real]]) -> pd.DataFrame:
    """Per-model rank of each score by AUC (:func:`auc_ranks`: 1 = best, ties share the best
    rank), plus a ``mean_rank`` row over models. Accepts :func:`auc_table` output or
    ``{model: {key: auc}}``."""
    df = _auc_frame(auc)
    ranks = df.apply(lambda row: auc_ranks(row.to_dict()), axis=1)
    ranks.loc["mean_rank"] = ranks.mean(axis=0)
    return ranks


def _auc_frame(auc: pd.DataFrame | Mapping[str, Mapping[str, Real]]) -> pd.DataFrame:
    if isinstance(auc, pd.DataFrame):
        return auc.astype(float)
    return pd.DataFrame.from_dict({m: dict(v) for m, v in auc.items()}, orient="index").astype(float)


def spearman_between_models(auc_by_model: pd.DataFrame | Mapping[str, Mapping[str, Real]]) -> pd.DataFrame:
    """Spearman ρ between the AUC vectors of every pair of models (over the scores both have).

    NaN where fewer than three shared scores (with two, ρ is always ±1), or where one vector is
    constant.
    """
    df = _auc_frame(auc_by_model)
    models = list(df.index)
    out = pd.DataFrame(np.nan, index=models, columns=models, dtype=float)
    for i, a in enumerate(models):
        for b in models[i:]:
            shared = df.loc[a].notna().to_numpy() & df.loc[b].notna().to_numpy()
            va, vb = df.loc[a].to_numpy()[shared], df.loc[b].to_numpy()[shared]
            if va.size < 3 or np.ptp(va) == 0 or np.ptp(vb) == 0:
                rho = float("nan")
            else:
                rho = float(stats.spearmanr(va, vb).statistic)
            out.loc[a, b] = out.loc[b, a] = rho
    return out


def top_k(auc: Mapping[str, Real], k: int = 5) -> list[str]:
    """The ``k`` score keys with the largest AUC (ties: input order)."""
    if k < 1:
        raise UserError(f"k must be at least 1; got {k}")
    ranked = sorted(((key, v) for key, v in auc.items() if not np.isnan(v)), key=lambda kv: -kv[1])
    return [key for key, _ in ranked[:k]]


def topk_iou(auc_by_model: pd.DataFrame | Mapping[str, Mapping[str, Real]], k: int = 5) -> pd.DataFrame:
    """IoU of every pair of models' top-``k`` score sets (by AUC)."""
    df = _auc_frame(auc_by_model)
    tops = {m: set(top_k(df.loc[m].to_dict(), k)) for m in df.index}
    models = list(df.index)
    out = pd.DataFrame(np.nan, index=models, columns=models, dtype=float)
    for a in models:
        for b in models:
            union = tops[a] | tops[b]
            out.loc[a, b] = len(tops[a] & tops[b]) / len(union) if union else 1.0
    return out


__all__ = [
    "MaxWithin",
    "auc_ranks",
    "auc_table",
    "max_fraction_table",
    "max_fraction_within",
    "max_fraction_within_censored",
    "normalized_auc",
    "rank_by_auc",
    "rank_table",
    "spearman_between_models",
    "table2",
    "top_k",
    "topk_iou",
]
