"""The look shared by every figure: the plotly template and font, and each score function's one
color (its family: AWFT, AEQD, FTVVN, AVVN, LTHON, AHON) and one line style (solid for LN, dashed
for raw, dotted for HN and Random), so a curve is recognizable across the report."""

import math
import zlib
from typing import Any

import plotly.graph_objects as go

from ..scoring.recording import HeadScores


TEMPLATE = "plotly_white"
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif", "size": 13}
FLAG_COLOR = "#ff1f5b"
BASELINE_COLOR = "#222222"

_FAMILY_COLORS = {
    "awft": "#1f77b4",
    "aeqd": "#ff7f0e",
    "ftvvn": "#2ca02c",
    "avvn": "#9467bd",
    "lthon": "#d62728",
    "ahon": "#0f8b8d",
    "fho": "#8c564b",
    "random": "#7f7f7f",
}
_EXTRA_COLORS = ("#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")


def score_color(key: str) -> str:
    """The color of score ``key`` in every figure (its family's; a stable pick for others)."""
    family = key.split("_")[0]
    if family in _FAMILY_COLORS:
        return _FAMILY_COLORS[family]
    return _EXTRA_COLORS[zlib.crc32(key.encode()) % len(_EXTRA_COLORS)]


def score_dash(key: str) -> str:
    """Line style of score ``key``: solid for LN variants, dotted for HN and Random, else dashed."""
    if key.endswith("_ln"):
        return "solid"
    if key.endswith("_hn") or key == "random":
        return "dot"
    return "dash"


def _layout(fig: go.Figure, title: str | None, **kwargs: Any) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE,
        font=FONT,
        title={"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 16}} if title else None,
        **kwargs,
    )
    return fig


def _layer_dtick(n_layers: int) -> int:
    """Whole-number layer ticks, about ten of them."""
    return max(1, math.ceil(n_layers / 10))



def _model_name(head_scores: HeadScores, default: str = "scores") -> str:
    return str(head_scores.metadata.get("model") or default)
