"""One fixed set of heads from per-input scores: what a static (input-independent) ablation or a
pruned checkpoint removes.

The paper's zeroing is dynamic: each input gets its own heads. A saving needs one set for all
inputs. :func:`static_heads` picks ``round(fraction · layers · heads)`` (layer, head) pairs from
scores recorded with nothing zeroed, by one of two rules:

- ``"flag_rate"``: the heads most often flagged at the matched quantile. τ is the pooled-CDF
  threshold at p = ``fraction`` (:func:`~inactive_heads.scoring.calibration.calibrate`, the
  paper's τ_p), each head's flag rate is the share of sequences on which the score calls it
  inactive at τ, and the heads with the highest rates win (ties: the more inactive mean score
  first, then layer and head order);
- ``"mean"``: the heads whose mean score over sequences is most inactive (lowest for "below"
  scores, highest for "above" scores such as AWFT).

Choose the set on calibration inputs and evaluate it on other questions: the set is then a
prediction, not a fit to the questions it is scored on.
"""

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..core.checks import check_heads, check_int, check_path, head_pairs  # noqa: F401 (check_heads: re-exported)
from ..core.errors import MissingFileError, UserError
from ..core.io import write_json_atomic
from ..scoring.calibration import Real, ScoresLike, calibrate, resolve_direction, score_tensor
from ..scoring.scores import flag_inactive

RULES = ("flag_rate", "mean")


@dataclass(frozen=True)
class HeadSet:
    """A fixed set of (layer, head) pairs and how it was chosen; iterates over the pairs.

    ``StaticAblation(head_set)`` zeroes it, ``export_pruned(model, head_set, ...)`` removes it.
    ``save``/``load`` write and read it as JSON.
    """

    heads: tuple[tuple[int, int], ...]
    n_layers: int
    n_heads: int
    key: str | None = None
    rule: str | None = None
    fraction: float | None = None
    threshold: float | None = None
    n_sequences: int = 0
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_int(self.n_layers, "n_layers")
        check_int(self.n_heads, "n_heads")
        heads = head_pairs(self.heads)
        object.__setattr__(self, "heads", heads)
        check_heads(heads, self.n_layers, self.n_heads)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.heads)

    def __len__(self) -> int:
        return len(self.heads)

    @property
    def realized_fraction(self) -> float:
        """Share of all (layer, head) pairs in the set."""
        return len(self.heads) / (self.n_layers * self.n_heads)

    def by_layer(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for l, h in self.heads:
            out.setdefault(l, []).append(h)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": [list(p) for p in self.heads],
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "key": self.key,
            "rule": self.rule,
            "fraction": self.fraction,
            "threshold": self.threshold,
            "n_sequences": self.n_sequences,
            "source": self.source,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeadSet":
        missing = [k for k in ("heads", "n_layers", "n_heads") if k not in data]
        if missing:
            raise UserError(f"a head set needs {missing}; write one with HeadSet.save")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["heads"] = tuple(tuple(p) for p in data["heads"])
        return cls(**known)

    def save(self, path: str | os.PathLike) -> Path:
        path = check_path(path, "path")
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HeadSet":
        path = check_path(path, "path")
        if not path.is_file():
            raise MissingFileError(f"no head set at '{path}'; write one with ih.static_heads(...).save(path)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"'{path}' is not a head-set JSON file ({e})") from None
        if isinstance(data, list):  # a bare list of [layer, head] pairs
            raise UserError(f"'{path}' is a bare list; a head set needs n_layers and n_heads (HeadSet.save writes them)")
        return cls.from_dict(data)


def check_fraction(fraction: Real) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, Real) or not (0.0 < float(fraction) < 1.0):
        raise UserError(f"fraction must lie strictly between 0 and 1 (e.g. 0.3 for 30 % of heads); got {fraction!r}")
    return float(fraction)


def inactive_order(primary: Float[Tensor, " n"], inactive_first: Float[Tensor, " n"]) -> Int[Tensor, " n"]:
    """Flat (layer · n_heads + head) indices, most inactive first: by ``primary`` ascending, ties by
    ``inactive_first`` (the mean score, signed so that ascending is more inactive), then by (layer,
    head) (a lexsort: stable sorts, last key first). The ranking rule of every static set.

    >>> inactive_order(torch.tensor([0.0, -1.0, 0.0, -1.0]), torch.tensor([5.0, 2.0, 1.0, 2.0])).tolist()
    [1, 3, 2, 0]
    """
    order = torch.arange(primary.numel())
    order = order[torch.sort(inactive_first[order], stable=True).indices]
    return order[torch.sort(primary[order], stable=True).indices]


def static_heads(
    head_scores: ScoresLike,
    key: str,
    fraction: Real,
    *,
    rule: str = "flag_rate",
    direction: str | None = None,
) -> HeadSet:
    """The ``round(fraction · layers · heads)`` heads that score ``key`` calls most inactive.

    >>> import torch
    >>> s = torch.tensor([[[0.1, 0.9], [0.5, 0.2]], [[0.2, 0.8], [0.6, 0.7]]])  # [seq, layer, head]
    >>> static_heads(s, "ahon_ln", 0.5, rule="mean").heads
    ((0, 0), (1, 1))

    ``head_scores`` is a :class:`~inactive_heads.HeadScores` recorded with nothing zeroed (or a
    ``[sequence, layer, head]`` tensor of one score). ``rule`` is ``"flag_rate"`` (most often
    flagged at τ_p with p = ``fraction``) or ``"mean"`` (most inactive mean score); module
    docstring. ``direction`` defaults to the registered score's.
    """
    fraction = check_fraction(fraction)
    if rule not in RULES:
        raise UserError(f"unknown rule {rule!r}; use one of {', '.join(RULES)}")
    direction = resolve_direction(key, direction)
    t = score_tensor(head_scores, key).to(torch.float64)
    if t.ndim != 3 or t.shape[0] == 0:
        raise UserError(f"score '{key}' must be [sequence, layer, head] with at least one sequence; got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise UserError(f"score '{key}' has NaN/inf values; rerecord in float32")
    n_seq, n_layers, n_heads = t.shape
    k = int(round(fraction * n_layers * n_heads))
    if k == 0:
        raise UserError(f"fraction {fraction} of {n_layers * n_heads} heads rounds to no head; use a larger fraction")
    mean = t.mean(dim=0).flatten()
    inactive_first = mean if direction == "below" else -mean  # ascending = more inactive first
    threshold = None
    if rule == "mean":
        primary = inactive_first
    else:
        threshold = calibrate(t, key, [fraction], direction=direction).values[0]
        rate = flag_inactive(t, threshold, direction).double().mean(dim=0).flatten()
        primary = -rate
    chosen = inactive_order(primary, inactive_first)[:k].tolist()
    heads = tuple((i // n_heads, i % n_heads) for i in chosen)
    meta = getattr(head_scores, "metadata", {}) or {}
    return HeadSet(heads, n_layers, n_heads, key=key, rule=rule, fraction=fraction, threshold=threshold,
                   n_sequences=n_seq, source=str(meta.get("inputs", "")))
