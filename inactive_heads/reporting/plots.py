"""Plotly figures of head scores and sweep results; every function returns a ``go.Figure``.

Each score function keeps one color (its family: AWFT, AEQD, FTVVN, AVVN, LTHON, AHON) and one
line style (solid for LN, dashed for raw, dotted for HN and Random) in every figure, so a curve
is recognizable across the report. Figures use the ``plotly_white`` template.

>>> import torch
>>> from inactive_heads.scoring.recording import HeadScores
>>> hs = HeadScores({"ahon_ln": torch.rand(5, 4, 3)}, {"model": "toy"})
>>> fig = score_heatmap(hs, "ahon_ln", threshold=0.5)
>>> [t.type for t in fig.data]
['heatmap', 'scatter']
>>> fig.layout.xaxis.title.text, fig.layout.yaxis.title.text
('head', 'layer')
"""

from ..scoring.scores import score_label  # noqa: F401  (public here too)
from .score_figures import (  # noqa: F401
    MAX_POINTS,
    flag_rate_heatmap,
    flagged_heads,
    iou_heatmap,
    layer_profiles,
    score_distributions,
    score_heatmap,
    wasserstein_heatmap,
)
from .style import TEMPLATE, score_color, score_dash  # noqa: F401
from .sweep_figures import accuracy_curves, auc_ranking, realized_by_layer  # noqa: F401

__all__ = [
    "MAX_POINTS",
    "TEMPLATE",
    "accuracy_curves",
    "auc_ranking",
    "flag_rate_heatmap",
    "flagged_heads",
    "iou_heatmap",
    "layer_profiles",
    "realized_by_layer",
    "score_color",
    "score_dash",
    "score_label",
    "score_distributions",
    "score_heatmap",
    "wasserstein_heatmap",
]
