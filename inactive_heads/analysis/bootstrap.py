"""The bootstrap over questions (docs/concepts.md, "Uncertainty"), numpy only: what evaluation
needs for one run's interval.

:func:`bootstrap_indices` draws one ``[B, n]`` matrix of question indices that every run shares
(all runs answer the same questions as the baseline); :func:`accuracy_interval` gives the 95 %
interval of one run's accuracy and :func:`questions_to_resolve` the sample a tolerance needs.
The paired comparisons with the baseline built on it are in :mod:`.paired`.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxtyping import Float, Int

from ..scoring.calibration import Real
from ..core.errors import UserError


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


__all__ = [
    "DEFAULT_RESAMPLES",
    "Interval",
    "accuracy_interval",
    "bootstrap_counts",
    "bootstrap_indices",
    "bootstrap_means",
    "percentile_interval",
    "questions_to_resolve",
]
