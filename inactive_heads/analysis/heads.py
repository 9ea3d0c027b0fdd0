"""Which heads scores flag, and how score distributions differ (no model needed):
:func:`flagged_mask` / :func:`iou`, the agreement between the heads two scores flag, and
:func:`wasserstein` / :func:`wasserstein_matrix`, the distance between score distributions
(our design, see the docstring)."""

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool
from scipy import stats
from torch import Tensor

from ..scoring.calibration import Real, ScoresLike, pooled_scores, resolve_direction, score_tensor
from ..scoring.scores import flag_inactive
from ..core.errors import UserError


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


__all__ = ["flagged_mask", "iou", "wasserstein", "wasserstein_matrix"]
