"""Paired comparisons of ablated runs with the baseline on the same questions.

* uncertainty (docs/concepts.md, "Uncertainty"): a paired bootstrap over questions, on the
  shared index matrix of :func:`.bootstrap.bootstrap_indices`. :func:`difference_interval` gives
  the 95 % interval of a run's paired difference from the baseline, and :func:`curve_intervals`
  recomputes every run's value on each resample, then each score's curve, then its max-% within
  tolerance and normalized AUC;
* label-free paired measures from the stored answer log-likelihoods: :func:`answer_agreement`
  (same chosen answer as the unablated model) and :func:`choice_kl` (KL divergence between the
  unablated and ablated distributions over the answer choices).
"""

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Bool, Float, Int
from scipy import special

from ..scoring.calibration import Real
from ..core.errors import UserError
from .bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    Interval,
    _as_values,
    _counts,
    bootstrap_indices,
    bootstrap_means,
    percentile_interval,
)
from .curves import _never_reached, max_fraction_within_censored


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
    "answer_agreement",
    "choice_kl",
    "chosen_answers",
    "curve_intervals",
    "difference_interval",
    "max_fraction_within_batch",
]
