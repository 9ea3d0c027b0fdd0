"""Summaries of ablation curves and score distributions (pure numpy/scipy; no model needed).

A *curve* is a list of ``(percent_zeroed, accuracy_percent)`` points for one score function on
one model: the realized % of (sequence, layer, head) triples zeroed (x) and the benchmark
accuracy in % (y), one point per threshold τ_p. From these:

* :func:`max_fraction_within`: the paper's Table 2 statistic, the largest % of heads that can be
  zeroed while accuracy stays within ``tolerance`` points of the baseline (docs/concepts.md, "Summarizing a curve");
  :func:`max_fraction_within_censored` says when a curve never reached its line, so that the
  value is a lower bound (what the toolkit's tables show; the paper's rule counts it 0);
* :func:`normalized_auc` / :func:`rank_by_auc`: the Fig. 3 ranking (docs/concepts.md, "Summarizing a curve");
* :func:`table2`, :func:`max_fraction_table`, :func:`auc_table`, :func:`rank_table`,
  :func:`spearman_between_models`, :func:`topk_iou`: the same over several models;
* :func:`flagged_mask` / :func:`iou`: agreement between the heads two scores flag;
* :func:`wasserstein` / :func:`wasserstein_matrix`: distance between score distributions
  (our design, see the docstring);
* uncertainty (docs/concepts.md, "Uncertainty"): a paired bootstrap over questions.
  :func:`bootstrap_indices` draws one ``[B, n]`` matrix of question indices that every run
  shares (all runs answer the same questions as the baseline), :func:`accuracy_interval` and
  :func:`difference_interval` give 95 % intervals of one run's accuracy and of its paired
  difference from the baseline, and :func:`curve_intervals` recomputes every run's value on each
  resample, then each score's curve, then its max-% within tolerance and normalized AUC;
* label-free paired measures from the stored answer log-likelihoods: :func:`answer_agreement`
  (same chosen answer as the unablated model) and :func:`choice_kl` (KL divergence between the
  unablated and ablated distributions over the answer choices).
"""

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from scipy import special, stats
from torch import Tensor

from ..scoring.calibration import Real, ScoresLike, pooled_scores, resolve_direction, score_tensor
from ..scoring.scores import flag_inactive
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
    return flag_inactive(score_tensor(head_scores, key), threshold, direction)


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
        raise UserError(f"iou needs boolean masks; got {a.dtype} and {b.dtype}")
    if a.shape != b.shape:
        raise UserError(f"masks differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
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
    distributions, but how they were computed is not stated there. We pool per
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


# ----------------------------------------------------------------------------------------------
# Uncertainty: a paired bootstrap over questions

DEFAULT_RESAMPLES = 2000
"""Bootstrap replicates used by the report and the CLI table (percentile intervals)."""
DEFAULT_LEVEL = 0.95
Z_95 = 1.959963984540054
"""The standard normal's 0.975 quantile (two-sided 95 %)."""


class Interval(NamedTuple):
    """A point estimate (computed on all questions) and a percentile bootstrap interval."""

    estimate: float
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    def __format__(self, spec: str) -> str:
        spec = spec or ".2f"
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def bootstrap_indices(n: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Int[np.ndarray, "B n"]:
    """``[n_resamples, n]`` question indices drawn with replacement (numpy's PCG64, ``seed``).

    Every statistic of one sweep is computed on the **same** matrix, so the runs stay paired: a
    replicate that happens to draw the hard questions draws them for the baseline too.

    >>> bootstrap_indices(4, n_resamples=2, seed=1).shape
    (2, 4)
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise UserError(f"need at least one question to resample; got n={n!r}")
    if not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise UserError(f"n_resamples must be a positive integer; got {n_resamples!r}")
    return np.random.default_rng(seed).integers(0, n, size=(int(n_resamples), int(n)))


def bootstrap_counts(n: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Float[np.ndarray, "B n"]:
    """How often each question is drawn in each replicate of :func:`bootstrap_indices`: the mean
    of per-question values ``v`` on every replicate is then ``counts @ v / n``."""
    return _counts(bootstrap_indices(n, n_resamples, seed), n)


def _counts(indices: Int[np.ndarray, "B n"], n: int) -> Float[np.ndarray, "B n"]:
    """How often each question is drawn in each replicate (one row per replicate)."""
    b = indices.shape[0]
    flat = (indices + n * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n).reshape(b, n).astype(np.float64)


def _as_values(values, n: int | None = None) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise UserError(f"per-question values must be a non-empty [runs, questions] array; got shape {arr.shape}")
    if n is not None and arr.shape[1] != n:
        raise UserError(f"runs must answer the same {n} questions; got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        raise UserError("per-question values contain NaN/inf")
    return arr


def bootstrap_means(
    values: Float[np.ndarray, "runs n"] | Float[np.ndarray, " n"], indices: Int[np.ndarray, "B n"]
) -> Float[np.ndarray, "B runs"]:
    """Mean of each run's per-question values on every resample: ``[B, runs]`` (one matmul)."""
    arr = _as_values(values)
    n = arr.shape[1]
    if indices.ndim != 2 or indices.shape[1] != n:
        raise UserError(f"indices must be [B, {n}]; got shape {indices.shape}")
    return _counts(indices, n) @ arr.T / n


def percentile_interval(
    estimate: Real, replicates: Float[np.ndarray, " B"], level: Real = DEFAULT_LEVEL
) -> Interval:
    """``estimate`` with the (1 − level)/2 and (1 + level)/2 quantiles of its replicates."""
    if not 0 < level < 1:
        raise UserError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    lo, hi = np.quantile(np.asarray(replicates, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(estimate), float(lo), float(hi))


def accuracy_interval(
    correct: Sequence[bool] | np.ndarray,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: Real = DEFAULT_LEVEL,
) -> Interval:
    """Accuracy in % of one run with its bootstrap interval over questions.

    >>> accuracy_interval([True, True, False, True])
    Interval(estimate=75.0, low=25.0, high=100.0)
    """
    values = 100.0 * _as_values(correct)[0]
    reps = bootstrap_means(values, bootstrap_indices(values.size, n_resamples, seed))[:, 0]
    return percentile_interval(values.mean(), reps, level)


def difference_interval(
    correct: Sequence[bool] | np.ndarray,
    baseline_correct: Sequence[bool] | np.ndarray,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: Real = DEFAULT_LEVEL,
) -> Interval:
    """Accuracy of a run minus the baseline's, in points, with a **paired** bootstrap interval:
    each replicate draws the same questions for both, so only the questions whose answer the
    ablation changed move the difference."""
    both = 100.0 * _as_values([np.asarray(correct, float), np.asarray(baseline_correct, float)])
    reps = bootstrap_means(both, bootstrap_indices(both.shape[1], n_resamples, seed))
    return percentile_interval(both[0].mean() - both[1].mean(), reps[:, 0] - reps[:, 1], level)


def questions_to_resolve(accuracy: Real, tolerance: Real = 1.0, *, z: Real = Z_95) -> int:
    """Questions needed for the baseline's 95 % interval to be no wider than ``tolerance`` points.

    Normal approximation to a proportion: the interval is about ±z·√(p(1−p)/n), so its full
    width 2z·√(p(1−p)/n) ≤ tol gives ``n ≥ (2z)²·p(1−p)/tol²`` (p and tol as fractions).
    ``accuracy`` and ``tolerance`` are in %.

    >>> questions_to_resolve(50.0, 1.0)  # (2·1.96)² · 0.25 / 0.01²
    38415
    """
    p = float(accuracy) / 100.0
    tol = float(tolerance) / 100.0
    if not 0 <= p <= 1 or tol <= 0:
        raise UserError(f"need accuracy in [0, 100] and tolerance > 0; got {accuracy}, {tolerance}")
    return int(np.ceil((2 * float(z)) ** 2 * max(p * (1 - p), 1e-12) / tol**2))


def _sorted_runs(points: Sequence[tuple[Real, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    xs = np.asarray([float(x) for x, _ in points], dtype=np.float64)
    order = np.argsort(xs, kind="stable")
    return xs[order], order


def max_fraction_within_batch(
    xs: Float[np.ndarray, " k"], ys: Float[np.ndarray, "B k"], line: Float[np.ndarray, " B"]
) -> Float[np.ndarray, " B"]:
    """:func:`max_fraction_within` (``if_never_crosses="zero"``, the paper's rule) for many curves
    at once that share their sorted x: row b is the curve ``ys[b]`` against the line ``line[b]``.
    :func:`curve_intervals` reads the same rows with their censoring."""
    return _batch_crossings(xs, ys, line)[0]


def _batch_crossings(
    xs: Float[np.ndarray, " k"], ys: Float[np.ndarray, "B k"], line: Float[np.ndarray, " B"]
) -> tuple[Float[np.ndarray, " B"], Bool[np.ndarray, " B"]]:
    """Per row: the last crossing's x (0.0 without one: the paper's rule) and whether the row is
    censored (no crossing, every point above its line: :func:`_never_reached`)."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    d = ys - np.asarray(line, dtype=np.float64)[:, None]
    k = xs.size
    # Events in the scalar scan order: point 0 on the line, then per segment i a strict
    # crossing inside it followed by point i + 1 on the line. The last true event wins.
    hit = np.zeros((ys.shape[0], 2 * k - 1), dtype=bool)
    at = np.zeros_like(hit, dtype=np.float64)
    hit[:, 0], at[:, 0] = d[:, 0] == 0, xs[0]
    if k > 1:
        d1, d2 = d[:, :-1], d[:, 1:]
        strict = d1 * d2 < 0
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = xs[:-1] + (-d1) * (xs[1:] - xs[:-1]) / (d2 - d1)
        hit[:, 1::2], at[:, 1::2] = strict, np.where(strict, x_cross, 0.0)
        hit[:, 2::2], at[:, 2::2] = d2 == 0, xs[1:]
    last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
    found = hit.any(axis=1)
    return np.where(found, at[np.arange(hit.shape[0]), last], 0.0), ~found & _never_reached(d)


def _auc_weights(xs: np.ndarray) -> np.ndarray:
    """w with ``ys @ w == normalized_auc(zip(xs, ys))`` (trapezoid over the span; plain mean if 0)."""
    k = xs.size
    span = float(xs[-1] - xs[0])
    if span == 0.0:
        return np.full(k, 1.0 / k)
    dx = np.diff(xs)
    w = np.zeros(k)
    w[:-1] += dx / 2
    w[1:] += dx / 2
    return w / span


CENSORING_COLUMNS = ["max_pct_within_censored", "max_pct_within_uncrossed", "max_pct_within_low_censored",
                     "max_pct_within_high_censored"]
"""The columns :func:`curve_intervals` adds after ``max_pct_within_high`` to say what is a lower bound."""


def _censored_interval(
    estimate: float, reps: np.ndarray, uncrossed: np.ndarray, bound: float, level: Real
) -> tuple[Interval, bool, bool]:
    """The percentile interval of replicates of which ``uncrossed`` ones are censored at ``bound``
    (the largest realized x, above every crossing), with whether each end is itself a bound.

    An end is a bound when it depends on a censored replicate: moving those replicates up moves
    it. Without censored replicates the replicates are used as they are (the same numbers as
    :func:`percentile_interval`)."""
    if not uncrossed.any():
        return percentile_interval(estimate, reps, level), False, False
    reps = np.where(uncrossed, bound, reps)
    interval = percentile_interval(estimate, reps, level)
    moved = percentile_interval(estimate, np.where(uncrossed, bound + 1.0 + abs(bound), reps), level)
    return interval, bool(moved.low != interval.low), bool(moved.high != interval.high)


def curve_intervals(
    curves: Mapping[str, Sequence[tuple[Real, Sequence[float] | np.ndarray]]],
    baseline: Sequence[float] | np.ndarray | Real,
    tolerance: Real = 1.0,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: Real = DEFAULT_LEVEL,
    indices: Int[np.ndarray, "B n"] | None = None,
) -> pd.DataFrame:
    """Max-% within ``tolerance`` and normalized AUC of every curve, with paired bootstrap intervals.

    ``curves[key]`` is a list of ``(realized % zeroed, per-question values)`` runs, where a run's
    curve value is the mean of its per-question values (e.g. ``100·correct`` for accuracy in %,
    ``100·agree`` for answer agreement). ``baseline`` is the baseline's per-question values
    (resampled with the runs) or a constant (e.g. 100 for agreement, which the baseline has by
    definition). Each replicate resamples the questions once, recomputes every run's value on
    that resample, rebuilds each curve and takes its statistics. The realized % (x) stays as
    measured: it counts (sequence, layer, head) triples, not questions.

    Censoring (:func:`max_fraction_within_censored`): a curve whose every point lies above its
    line never reached it in the tested range, so its max-% is at least its largest realized x,
    which is then its value, flagged ``max_pct_within_censored``. A replicate whose curve does
    not reach its line is likewise at least that x: it counts as that bound and ranks above every
    replicate that crosses (never as 0), and ``max_pct_within_uncrossed`` counts them. An end of
    the interval that falls among them (moves if they move up) is itself a lower bound, flagged
    ``max_pct_within_low_censored`` / ``max_pct_within_high_censored``. Curves whose replicates
    all cross get the same numbers as without censoring.

    Returns one row per key: ``score, max_pct_within, max_pct_within_low, max_pct_within_high,
    max_pct_within_censored, max_pct_within_uncrossed, max_pct_within_low_censored,
    max_pct_within_high_censored, normalized_auc, auc_low, auc_high``.
    """
    sizes = {np.asarray(v).shape[-1] for pts in curves.values() for _, v in pts}
    if not np.isscalar(baseline):
        sizes.add(np.asarray(baseline).shape[-1])
    if len(sizes) > 1:
        raise UserError(f"runs must answer the same questions; got per-question arrays of sizes {sorted(sizes)}")
    columns = ["score", "max_pct_within", "max_pct_within_low", "max_pct_within_high", *CENSORING_COLUMNS,
               "normalized_auc", "auc_low", "auc_high"]
    if not sizes:
        return pd.DataFrame(columns=columns)
    n = sizes.pop()
    if indices is None:
        indices = bootstrap_indices(n, n_resamples, seed)
    counts = _counts(indices, n)
    if np.isscalar(baseline):
        base_hat = float(baseline)
        base_reps = np.full(indices.shape[0], base_hat)
    else:
        base_values = _as_values(baseline, n)[0]
        base_hat = float(base_values.mean())
        base_reps = counts @ base_values / n
    rows = []
    for key, pts in curves.items():
        if not len(pts):
            continue
        xs, order = _sorted_runs(pts)
        values = _as_values([np.asarray(pts[i][1], dtype=np.float64) for i in order], n)
        y_hat = values.mean(axis=1)
        y_reps = counts @ values.T / n  # [B, k]
        estimate = max_fraction_within_censored(np.column_stack([xs, y_hat]), base_hat, tolerance)
        reps, uncrossed = _batch_crossings(xs, y_reps, base_reps - float(tolerance))
        within, low_censored, high_censored = _censored_interval(estimate.value, reps, uncrossed, xs[-1], level)
        w = _auc_weights(xs)
        auc = percentile_interval(float(y_hat @ w), y_reps @ w, level)
        rows.append([key, *within, estimate.censored, int(uncrossed.sum()), low_censored, high_censored, *auc])
    return pd.DataFrame(rows, columns=columns)


# ----------------------------------------------------------------------------------------------
# Label-free paired measures from the answer log-likelihoods


def _loglik_rows(loglikelihoods: Sequence[Sequence[float]] | np.ndarray) -> list[np.ndarray] | np.ndarray:
    """A ``[questions, choices]`` array when every question has as many choices (the usual case),
    else one array per question."""
    if isinstance(loglikelihoods, np.ndarray) and loglikelihoods.ndim == 2:
        rows = loglikelihoods.astype(np.float64)
    else:
        rows = [np.asarray(ll, dtype=np.float64) for ll in loglikelihoods]
        if rows and all(r.ndim == 1 for r in rows) and len({r.size for r in rows}) == 1:
            rows = np.stack(rows)
    if len(rows) == 0 or any(r.ndim != 1 or r.size < 2 for r in rows):
        raise UserError("log-likelihoods must be one list of at least two choices per question")
    return rows


def chosen_answers(loglikelihoods: Sequence[Sequence[float]] | np.ndarray) -> Int[np.ndarray, " n"]:
    """Index of the answer each question's model picks: the largest log-likelihood (first on ties,
    as lm-eval's ``argmax``)."""
    rows = _loglik_rows(loglikelihoods)
    if isinstance(rows, np.ndarray):
        return np.argmax(rows, axis=1)
    return np.asarray([int(np.argmax(r)) for r in rows])


def answer_agreement(
    loglikelihoods: Sequence[Sequence[float]] | np.ndarray,
    baseline_loglikelihoods: Sequence[Sequence[float]] | np.ndarray,
) -> Bool[np.ndarray, " n"]:
    """Per question: does the ablated run choose the same answer as the unablated model?
    (No labels needed; the mean is the answer agreement.)"""
    a, b = chosen_answers(loglikelihoods), chosen_answers(baseline_loglikelihoods)
    if a.shape != b.shape:
        raise UserError(f"runs must answer the same questions; got {a.size} and {b.size}")
    return a == b


def choice_kl(
    loglikelihoods: Sequence[Sequence[float]] | np.ndarray,
    baseline_loglikelihoods: Sequence[Sequence[float]] | np.ndarray,
) -> Float[np.ndarray, " n"]:
    """Per question: KL(baseline ‖ ablated) in nats between the two distributions over the answer
    choices, each the softmax of that run's choice log-likelihoods."""
    runs, bases = _loglik_rows(loglikelihoods), _loglik_rows(baseline_loglikelihoods)
    if len(runs) != len(bases) or any(r.size != b.size for r, b in zip(runs, bases)):
        raise UserError("runs must answer the same questions with the same number of choices")
    if isinstance(runs, np.ndarray) and isinstance(bases, np.ndarray):
        log_p, log_q = special.log_softmax(bases, axis=1), special.log_softmax(runs, axis=1)
        return np.maximum(np.sum(np.exp(log_p) * (log_p - log_q), axis=1), 0.0)
    out = np.empty(len(runs))
    for i, (q_ll, p_ll) in enumerate(zip(runs, bases)):
        log_p, log_q = special.log_softmax(p_ll), special.log_softmax(q_ll)
        out[i] = float(np.sum(np.exp(log_p) * (log_p - log_q)))
    return np.maximum(out, 0.0)


__all__ = [
    "DEFAULT_RESAMPLES",
    "Interval",
    "accuracy_interval",
    "answer_agreement",
    "bootstrap_counts",
    "bootstrap_indices",
    "bootstrap_means",
    "choice_kl",
    "chosen_answers",
    "curve_intervals",
    "difference_interval",
    "max_fraction_within_batch",
    "MaxWithin",
    "max_fraction_within_censored",
    "percentile_interval",
    "questions_to_resolve",
    "auc_table",
    "flagged_mask",
    "iou",
    "max_fraction_table",
    "max_fraction_within",
    "normalized_auc",
    "auc_ranks",
    "rank_by_auc",
    "rank_table",
    "spearman_between_models",
    "table2",
    "top_k",
    "topk_iou",
    "wasserstein",
    "wasserstein_matrix",
]
