"""Summaries of ablation curves and score distributions (pure numpy/scipy; no model needed).

A *curve* is a list of ``(percent_zeroed, accuracy_percent)`` points for one score function on
one model: the realized % of (sequence, layer, head) triples zeroed (x) and the benchmark
accuracy in % (y), one point per threshold τ_p. From these:

* :func:`max_fraction_within`: the paper's Table 2 statistic, the largest % of heads that can be
  zeroed while accuracy stays within ``tolerance`` points of the baseline (METHOD.md §5.6);
* :func:`normalized_auc` / :func:`rank_by_auc`: the Fig. 3 ranking (METHOD.md §5.7);
* :func:`table2`, :func:`max_fraction_table`, :func:`auc_table`, :func:`rank_table`,
  :func:`spearman_between_models`, :func:`topk_iou`: the same over several models;
* :func:`flagged_mask` / :func:`iou`: agreement between the heads two scores flag;
* :func:`wasserstein` / :func:`wasserstein_matrix`: distance between score distributions
  (METHOD.md §9; our design, see the docstring).
"""

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from scipy import stats
from torch import Tensor

from .calibration import pooled_scores, resolve_direction, score_tensor
from .recording import HeadScores

Real = int | float | np.integer | np.floating
Points = Sequence[Sequence[Real]] | np.ndarray
ScoresLike = HeadScores | Float[Tensor, "..."] | np.ndarray


def _curve(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """Points as float arrays (x, y) sorted by x (stable: ties keep their input order)."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("a curve needs at least one (percent_zeroed, accuracy) point; got none")
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"points must be (percent_zeroed, accuracy) pairs; got an array of shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"points contain NaN/inf: {arr.tolist()}")
    order = np.argsort(arr[:, 0], kind="stable")
    return arr[order, 0], arr[order, 1]


# ----------------------------------------------------------------------------------------------
# One curve


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
    * no crossing at all gives 0.0.

    Our reading of the no-crossing case: it arises when every point is above the line (the
    function never cost a full point of accuracy within its realized range, e.g. a function
    whose realized % stays small) or every point is below it. The notebook reports 0 for both,
    and Table 2 is reproduced only with that, so it is the default. For "every point above",
    0 understates the truth: the real answer is at least the largest realized x, which
    ``if_never_crosses="max_x"`` returns instead (points all below still give 0.0).

    Tolerance is in absolute accuracy points (1.0 = "within 1%" of the paper). A single point is
    accepted (the notebook returned 0 for fewer than two points): it counts only if it lies on
    the line.
    """
    if if_never_crosses not in ("zero", "max_x"):
        raise ValueError(f"if_never_crosses={if_never_crosses!r} must be 'zero' or 'max_x'")
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
        return last
    if if_never_crosses == "max_x" and bool((ys > line).all()):
        return float(xs[-1])
    return 0.0


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


def rank_by_auc(curves: Mapping[str, Points]) -> list[tuple[str, float]]:
    """``[(key, normalized AUC), ...]``, best (largest) first; ties keep the input order."""
    scored = [(key, normalized_auc(pts)) for key, pts in curves.items()]
    return sorted(scored, key=lambda kv: -kv[1])


# ----------------------------------------------------------------------------------------------
# Several models: results[model][score_key] = points


def max_fraction_table(
    results: Mapping[str, Mapping[str, Points]],
    baselines: Mapping[str, Real],
    tolerance: Real = 1.0,
) -> pd.DataFrame:
    """:func:`max_fraction_within` for every (model, score): models as rows, scores as columns
    (NaN where a model lacks a score)."""
    missing = [m for m in results if m not in baselines]
    if missing:
        raise ValueError(f"no baseline accuracy for {missing}; baselines has {list(baselines)}")
    rows = {
        model: {key: max_fraction_within(pts, baselines[model], tolerance) for key, pts in curves.items()}
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
) -> pd.DataFrame:
    """The paper's Table 2: per model, the max % zeroed within ``tolerance`` points of the
    baseline for ``sink_key`` (AWFT) and for the best of **all other** scores in ``results``
    (Random and AWFT (LN) included, METHOD.md §5.6).

    Columns: ``model``, ``<sink_key>_max_pct``, ``best_other_key``, ``best_other_max_pct``,
    ``delta`` (best other − sink). Ties for best other go to the first key in ``results`` order.
    ``baselines[model]`` is the accuracy with nothing zeroed (the paper used its Random p = 0
    run). ``mean_row=True`` appends a ``model="mean"`` row averaging the numeric columns (the
    headline number is the mean of ``best_other_max_pct``).
    """
    rows = []
    for model, curves in results.items():
        if sink_key not in curves:
            raise ValueError(f"model '{model}' has no '{sink_key}' curve; it has {list(curves)}")
        if model not in baselines:
            raise ValueError(f"no baseline accuracy for '{model}'; baselines has {list(baselines)}")
        base = baselines[model]
        sink = max_fraction_within(curves[sink_key], base, tolerance)
        best_key, best = None, float("nan")
        for key, pts in curves.items():
            if key == sink_key:
                continue
            value = max_fraction_within(pts, base, tolerance)
            if best_key is None or value > best:
                best_key, best = key, value
        rows.append(
            {
                "model": model,
                f"{sink_key}_max_pct": sink,
                "best_other_key": best_key,
                "best_other_max_pct": best,
                "delta": best - sink,
            }
        )
    df = pd.DataFrame(
        rows, columns=["model", f"{sink_key}_max_pct", "best_other_key", "best_other_max_pct", "delta"]
    )
    if mean_row and len(df):
        numeric = [f"{sink_key}_max_pct", "best_other_max_pct", "delta"]
        mean = {"model": "mean", "best_other_key": None, **{c: float(df[c].mean()) for c in numeric}}
        df = pd.concat([df, pd.DataFrame([mean], columns=df.columns)], ignore_index=True)
    return df


def auc_table(results: Mapping[str, Mapping[str, Points]]) -> pd.DataFrame:
    """Normalized AUC for every (model, score): models as rows, scores as columns."""
    rows = {model: {key: normalized_auc(pts) for key, pts in curves.items()} for model, curves in results.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def rank_table(auc: pd.DataFrame | Mapping[str, Mapping[str, Real]]) -> pd.DataFrame:
    """Per-model rank of each score by AUC (1 = best; ties share the best rank), plus a
    ``mean_rank`` row over models. Accepts :func:`auc_table` output or ``{model: {key: auc}}``."""
    df = _auc_frame(auc)
    ranks = df.rank(axis=1, ascending=False, method="min")
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
        raise ValueError(f"k must be at least 1; got {k}")
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


# ----------------------------------------------------------------------------------------------
# Flagged heads


def flagged_mask(
    head_scores: ScoresLike,
    key: str,
    threshold: Real,
    direction: str | None = None,
) -> Bool[Tensor, "*dims"]:
    """Boolean mask of the (sequence, layer, head) entries flagged inactive at ``threshold``.

    ``score < τ`` for "below", ``score > τ`` for "above"; ``direction`` defaults to the
    registered score's (required for a raw tensor of an unregistered score). Static: the scores
    are the recorded ones, with no ablation cascade.
    """
    direction = resolve_direction(key, direction)
    t = score_tensor(head_scores, key)
    return t > threshold if direction == "above" else t < threshold


def iou(
    mask_a: Bool[Tensor, "*dims"] | Bool[np.ndarray, "*dims"],
    mask_b: Bool[Tensor, "*dims"] | Bool[np.ndarray, "*dims"],
) -> float:
    """Intersection over union of two boolean masks of the same shape.

    Two empty masks (nothing flagged by either) give 1.0: the two selections agree exactly, and
    this keeps ``iou(m, m) == 1`` for every mask m.
    """
    a = torch.as_tensor(mask_a)
    b = torch.as_tensor(mask_b)
    if a.dtype != torch.bool or b.dtype != torch.bool:
        raise ValueError(f"iou needs boolean masks; got {a.dtype} and {b.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"masks differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    # numpy counts booleans far faster than torch's sum (which widens to int64 first).
    a_np, b_np = a.cpu().numpy(), b.cpu().numpy()
    union = int(np.count_nonzero(a_np | b_np))
    if union == 0:
        return 1.0
    return int(np.count_nonzero(a_np & b_np)) / union


# ----------------------------------------------------------------------------------------------
# Score distributions


def wasserstein(head_scores_a: ScoresLike, head_scores_b: ScoresLike, key: str) -> float:
    """1-D Wasserstein-1 distance between two pooled empirical distributions of score ``key``.

    Each side's values over all (sequence, layer, head) are pooled into one sample (the two
    pools may differ in size: different models have different L and H) and compared with
    ``scipy.stats.wasserstein_distance``: the area between the two empirical CDFs, in the
    score's own units.

    This is our design. The paper reports Wasserstein distances between models' score
    distributions, but how they were computed was not recovered (METHOD.md §9). We pool per
    score function and do **not** renormalize: the LN scores are already scale-free (a head's
    value relative to its layer mean), so their distances compare directly across models; the
    raw scores (e.g. AHON, AVVN) then compare absolute magnitudes, which differ between
    architectures and sizes by design, so read raw-score distances within one model family.
    """
    return float(stats.wasserstein_distance(pooled_scores(head_scores_a, key), pooled_scores(head_scores_b, key)))


def wasserstein_matrix(named: Mapping[str, ScoresLike], key: str) -> pd.DataFrame:
    """:func:`wasserstein` for every pair of named score sets: symmetric, zero diagonal."""
    names = list(named)
    pools = {n: pooled_scores(named[n], key) for n in names}
    out = pd.DataFrame(0.0, index=names, columns=names)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            out.loc[a, b] = out.loc[b, a] = float(stats.wasserstein_distance(pools[a], pools[b]))
    return out


__all__ = [
    "auc_table",
    "flagged_mask",
    "iou",
    "max_fraction_table",
    "max_fraction_within",
    "normalized_auc",
    "rank_by_auc",
    "rank_table",
    "spearman_between_models",
    "table2",
    "top_k",
    "topk_iou",
    "wasserstein",
    "wasserstein_matrix",
]
