"""Static thresholds: quantiles of a score's pooled empirical CDF, and the paper's released presets.

The paper picks one global threshold τ per (model, task, score function) from a calibration run
with nothing zeroed (docs/concepts.md, "Thresholds"): every (sequence, layer, head) score goes into one pool of N
values, the pool is sorted, the i-th smallest value x_i (1-indexed) is paired with y_i = i/N, and
τ_p is read off that piecewise-linear CDF by linear interpolation at y = p for "below" scores
(inactive if score < τ) or at y = 1 − p for "above" scores (inactive if score > τ). The y value is
clamped to the CDF's range [1/N, 1], so p = 0 gives the pool's minimum ("below") or maximum
("above") and flags (almost) nothing. The Random baseline's "thresholds" are the p values
themselves. This reproduces ``x_intercept_for_cdf`` of the authors' code.

>>> import torch
>>> t = calibrate(torch.arange(1.0, 11.0).reshape(10, 1, 1), "my_score", direction="below")
>>> [round(v, 6) for v in t.values]
[1.0, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0]
>>> official_thresholds("meta-llama/Llama-3.2-3B", "mmlu", "ahon_ln").values[1]
0.36328125

``official_thresholds`` reads the thresholds released with the paper (``data/
official_thresholds.json``, MIT License, see ``data/OFFICIAL_THRESHOLDS_LICENSE.txt``). They were
computed in bf16 (OLMo-2: fp16 and 8-bit) with the authors' batching and BOS conventions, so they
are only meaningful for those exact models and settings.
"""

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .recording import HeadScores, record_scores
from .scores import OFFICIAL_NAMES, flag_inactive, get_score
from ..core.errors import UnknownNameError, UserError, WrongTypeError

DEFAULT_QUANTILES: tuple[float, ...] = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
"""The paper's seven nominal fractions p."""

DIRECTIONS = ("below", "above")
_FROM_OFFICIAL = {v: k for k, v in OFFICIAL_NAMES.items()}

Real = int | float | np.integer | np.floating
ScoresLike = HeadScores | Float[Tensor, "..."] | np.ndarray


@dataclass
class Thresholds:
    """Thresholds τ_p of one score function, one per nominal fraction p.

    ``source`` is ``"calibrated"`` or ``"official:<task>/<model>"``. ``n_scores`` is the size of
    the pool the quantiles came from (0 when unknown, as for the official presets).
    ``quantiles`` and ``values`` are stored as tuples of Python floats whatever sequence of
    numbers was passed. Iterating gives ``(p, τ)`` pairs.
    """

    key: str
    quantiles: Sequence[Real]
    values: Sequence[Real]
    direction: str
    source: str = "calibrated"
    n_scores: int = 0

    def __post_init__(self):
        try:
            self.quantiles = tuple(float(p) for p in self.quantiles)
            self.values = tuple(float(v) for v in self.values)
            self.n_scores = int(self.n_scores)
        except (TypeError, ValueError):
            raise WrongTypeError(f"thresholds for {self.key!r}: quantiles and values must be lists of numbers and "
                                 f"n_scores an integer, got {self.quantiles!r}, {self.values!r}, {self.n_scores!r}") from None
        if len(self.quantiles) != len(self.values):
            raise UserError(
                f"thresholds for '{self.key}': {len(self.quantiles)} quantiles but {len(self.values)} values"
            )
        if self.direction not in DIRECTIONS:
            raise UserError(f"direction {self.direction!r} must be 'below' or 'above'")

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(zip(self.quantiles, self.values))

    def __len__(self) -> int:
        return len(self.values)

    def items(self) -> list[tuple[float, float]]:
        """``[(p, τ_p), ...]`` in the stored order."""
        return list(self)

    def has(self, p: Real) -> bool:
        """Whether ``p`` is one of ``quantiles`` (up to 1e-9, the one matching rule)."""
        return any(abs(q - p) <= 1e-9 for q in self.quantiles)

    def at(self, p: Real) -> float:
        """τ for nominal fraction ``p`` (which must be one of ``quantiles``, up to 1e-9)."""
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise WrongTypeError(f"p must be a number, one of {list(self.quantiles)}; got {p!r}")
        for q, v in self:
            if abs(q - p) <= 1e-9:
                return v
        raise UnknownNameError(f"no threshold for p={p} in '{self.key}'; have p in {list(self.quantiles)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "quantiles": list(self.quantiles),
            "values": list(self.values),
            "direction": self.direction,
            "source": self.source,
            "n_scores": self.n_scores,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Thresholds":
        if not isinstance(data, dict):
            raise WrongTypeError(f"thresholds must be a dict (Thresholds.to_dict), got {type(data).__name__}")
        missing = [f for f in ("key", "quantiles", "values", "direction") if f not in data]
        if missing:
            raise UserError(f"thresholds dict lacks {missing}; it needs key, quantiles, values, direction")
        return cls(
            key=data["key"],
            quantiles=tuple(data["quantiles"]),
            values=tuple(data["values"]),
            direction=data["direction"],
            source=data.get("source", "calibrated"),
            n_scores=data.get("n_scores", 0),
        )


# ----------------------------------------------------------------------------------------------
# Helpers shared with analysis.py


def resolve_direction(key: str, direction: str | None) -> str:
    """``direction`` if given, else the registered score's direction."""
    if direction is None:
        try:
            return get_score(key).direction
        except KeyError:
            raise UserError(
                f"score '{key}' is not registered, so pass direction='below' or direction='above'"
            ) from None
    if direction not in DIRECTIONS:
        raise UserError(f"direction {direction!r} must be 'below' or 'above'")
    return direction


def score_tensor(scores: ScoresLike, key: str) -> Tensor:
    """``scores[key]`` for a HeadScores, else the tensor/array itself, as a CPU tensor."""
    if isinstance(scores, HeadScores):
        return scores[key]
    if isinstance(scores, np.ndarray):
        return torch.from_numpy(scores)
    if not isinstance(scores, Tensor):
        raise WrongTypeError(f"head_scores must be a HeadScores, a tensor or a numpy array, got {type(scores).__name__}")
    return scores.detach().cpu()


def pooled_scores(scores: ScoresLike, key: str) -> np.ndarray:
    """All (sequence, layer, head) values of one score flattened to float64, checked finite."""
    pool = score_tensor(scores, key).detach().cpu().double().flatten().numpy()
    if pool.size == 0:
        raise UserError(f"score '{key}': no values to pool (empty tensor)")
    bad = int(np.count_nonzero(~np.isfinite(pool)))
    if bad:
        raise UserError(f"score '{key}': {bad} of {pool.size} values are NaN/inf; drop them or rerecord in float32")
    return pool


def check_quantiles(quantiles: Sequence[Real] | np.ndarray, *, distinct: bool = False) -> tuple[float, ...]:
    """The fractions p as floats, each in [0, 1) (and all different when ``distinct``); else one line
    naming the first bad value. The one check of quantiles: calibration, sweeps and the CLI use it.

    >>> check_quantiles([0, 0.1])
    (0.0, 0.1)
    >>> check_quantiles([30])
    Traceback (most recent call last):
    ...
    inactive_heads.core.errors.UserError: quantiles must be in [0, 1), got 30.0 (a fraction: 0.3 is 30 % of heads)
    """
    try:
        qs = tuple(float(p) for p in quantiles)
    except (TypeError, ValueError):
        raise UserError(f"quantiles must be numbers in [0, 1), got {quantiles!r}") from None
    if not qs:
        raise UserError("quantiles is empty; pass fractions p in [0, 1), e.g. DEFAULT_QUANTILES")
    bad = [p for p in qs if not (0.0 <= p < 1.0)]
    if bad:
        raise UserError(f"quantiles must be in [0, 1), got {bad[0]!r} (a fraction: 0.3 is 30 % of heads)")
    if distinct and len(set(qs)) != len(qs):
        raise UserError(f"quantiles must be distinct, got {list(qs)!r}")
    return qs


# ----------------------------------------------------------------------------------------------
# Calibration


def cdf_x_intercept(sorted_pool: np.ndarray, y: Real | np.ndarray) -> np.ndarray:
    """x where the piecewise-linear empirical CDF (x_i, i/N) reaches ``y`` (clamped to [1/N, 1])."""
    n = sorted_pool.size
    ys = np.arange(1, n + 1, dtype=np.float64) / n
    return np.interp(np.clip(y, ys[0], ys[-1]), ys, sorted_pool)


def calibrate(
    head_scores: ScoresLike | None,
    key: str,
    quantiles: Sequence[Real] | np.ndarray = DEFAULT_QUANTILES,
    *,
    direction: str | None = None,
) -> Thresholds:
    """Thresholds τ_p of score ``key`` from its pooled empirical CDF (docs/concepts.md, "Thresholds").

    ``head_scores`` is a :class:`HeadScores` (recorded with nothing zeroed) or a raw tensor/array
    of that score's values (any shape; everything is pooled). ``direction`` defaults to the
    registered score's; it must be given for a raw tensor of an unregistered score. For
    ``key="random"`` the thresholds are the p values themselves (no scores needed).
    """
    qs = check_quantiles(quantiles)
    if key == "random":
        n = 0
        if head_scores is not None and (not isinstance(head_scores, HeadScores) or "random" in head_scores):
            n = int(score_tensor(head_scores, key).numel())
        return Thresholds(key, qs, qs, resolve_direction(key, direction), "calibrated", n)
    if head_scores is None:
        raise UserError(f"calibrate('{key}') needs scores; pass a HeadScores or a tensor")
    direction = resolve_direction(key, direction)
    pool = np.sort(pooled_scores(head_scores, key))
    p = np.asarray(qs, dtype=np.float64)
    values = cdf_x_intercept(pool, p if direction == "below" else 1.0 - p)
    return Thresholds(key, qs, tuple(values.tolist()), direction, "calibrated", pool.size)


def calibrate_on(
    model,
    inputs,
    score: str,
    p: Real | Sequence[Real],
    *,
    batch_size: int = 8,
    progress: bool = False,
    seed: int = 0,
    description: str | None = None,
) -> Thresholds:
    """τ of ``score`` at quantile(s) ``p``, calibrated on a run's own inputs with nothing zeroed:
    the one way every entry point (a sweep, the lm-eval model's ``score@pP``, ``predict``, the
    ``calibrate`` command) turns "this run's inputs" into thresholds.

    ``inputs``: the run's inputs (texts or token-id lists), whose scores are recorded here with
    :func:`~inactive_heads.scoring.recording.record_scores` (``batch_size``, ``progress``, ``seed``,
    ``description`` go to it; in-pass recording gives the same bits); or the :class:`HeadScores`
    already recorded on them (a sweep's baseline pass records in the same pass as its evaluation;
    a scores file), when ``model`` is not used. ``p``: one quantile or several.
    """
    quantiles = [p] if isinstance(p, Real) else list(p)
    recorded = inputs
    if not isinstance(inputs, HeadScores):
        recorded = record_scores(model, inputs, [score], batch_size=batch_size, progress=progress, seed=seed,
                                 description=description)
    return calibrate(recorded, score, quantiles)


def flag_fraction(
    head_scores: ScoresLike,
    key: str,
    threshold: Real,
    direction: str | None = None,
) -> float:
    """Fraction of (sequence, layer, head) entries flagged at ``threshold`` (static: no cascade).

    "below" flags ``score < τ``, "above" flags ``score > τ`` (the registered score's direction
    by default).
    """
    direction = resolve_direction(key, direction)
    t = score_tensor(head_scores, key)
    if t.numel() == 0:
        raise UserError(f"score '{key}': no values (empty tensor)")
    return float(flag_inactive(t, threshold, direction).double().mean())


# ----------------------------------------------------------------------------------------------
# The paper's released thresholds


@lru_cache(maxsize=1)
def _official_data() -> dict[str, dict[str, dict[str, list[float]]]]:
    text = files("inactive_heads").joinpath("data", "official_thresholds.json").read_text(encoding="utf-8")
    return json.loads(text)


def official_tasks() -> list[str]:
    """Tasks with released thresholds (``mmlu``, ``piqa``, ``winogrande``)."""
    return list(_official_data())


def _task(task: str) -> str:
    data = _official_data()
    name = str(task).lower()
    if name not in data:
        raise UserError(f"no official thresholds for task '{task}'; available: {', '.join(data)}")
    return name


def official_models(task: str | None = None) -> list[str]:
    """Model names (``org_name`` form, as in the release) with official thresholds for ``task``
    (or for any task), in the release's order."""
    data = _official_data()
    tasks = [_task(task)] if task is not None else list(data)
    out: list[str] = []
    for t in tasks:
        out.extend(m for m in data[t] if m not in out)
    return out


def _model(task: str, model: str) -> str:
    models = _official_data()[task]
    name = str(model).replace("/", "_")
    if name in models:
        return name
    by_lower = {m.lower(): m for m in models}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise UserError(
        f"no official thresholds for model '{model}' on {task}; available: {', '.join(models)}"
    )


def official_thresholds(model: str, task: str, key: str) -> Thresholds:
    """The paper's released τ_p (p = 0, 5, …, 30 %) for one model, task and score.

    ``model`` as on the Hub (``"meta-llama/Llama-3.2-3B"``) or as in the release
    (``"meta-llama_Llama-3.2-3B"``); ``key`` is our key (``"ahon_ln"``) or the official name
    (``"HONOR"``). ``"random"`` gives the p values (the authors' Random baseline used p itself).
    Of the App. A.1 full-head-output scores, the release has ``fho`` and ``fho_ln``
    (``FullHeadOutput``, ``FullHeadOutputNormalized``) for MMLU on Llama-3.1-8B-Instruct,
    Qwen2.5-3B and Qwen2.5-7B only.
    """
    task = _task(task)
    model = _model(task, model)
    ours = _FROM_OFFICIAL.get(key, key)
    source = f"official:{task}/{model}"
    if ours == "random":
        return Thresholds("random", DEFAULT_QUANTILES, DEFAULT_QUANTILES, "below", source, 0)
    released = _official_data()[task][model]
    name = OFFICIAL_NAMES.get(ours)
    if name is None or name not in released:
        have = [_FROM_OFFICIAL.get(n, n) for n in released] + ["random"]
        raise UserError(f"no official thresholds for score '{key}'; available: {', '.join(have)}")
    values = released[name]
    if len(values) != len(DEFAULT_QUANTILES):
        raise UserError(f"official entry {task}/{model}/{name} has {len(values)} values, expected 7")
    return Thresholds(ours, DEFAULT_QUANTILES, tuple(values), get_score(ours).direction, source, 0)


__all__ = [
    "DEFAULT_QUANTILES",
    "Thresholds",
    "calibrate",
    "cdf_x_intercept",
    "flag_fraction",
    "official_models",
    "official_tasks",
    "official_thresholds",
    "pooled_scores",
]
