"""Figures of recorded head scores: per-head heatmaps, per-layer profiles, pooled distributions,
and the agreement (IoU, Wasserstein-1) between scores and models; each returns a ``go.Figure``."""

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Bool, Float
from plotly.colors import qualitative
from plotly.subplots import make_subplots
from torch import Tensor

from ..analysis.heads import Real, flagged_mask, iou, wasserstein_matrix
from ..scoring.calibration import Thresholds, pooled_scores, resolve_direction
from ..scoring.recording import HeadScores
from ..scoring.scores import flag_inactive, get_score, is_registered, score_label
from ..core.errors import OutOfRangeError, UnknownNameError, UserError
from .style import FLAG_COLOR, _layer_dtick, _layout, _model_name, score_color


MAX_POINTS = 20_000
"""Most points one distribution trace sends to the browser (larger pools are subsampled)."""


def flagged_heads(
    values: Float[Tensor, "layer head"], key: str, threshold: Real, *, direction: str | None = None
) -> Bool[Tensor, "layer head"]:
    """Heads that score ``key`` calls inactive at τ = ``threshold`` (in ``direction``, by default
    the registered score's)."""
    return flag_inactive(values, float(threshold), resolve_direction(key, direction))


def score_heatmap(
    head_scores: HeadScores,
    key: str,
    *,
    sequence: int | None = None,
    threshold: Real | None = None,
    title: str | None = None,
    label: str | None = None,
    direction: str | None = None,
) -> go.Figure:
    """Layer (y, layer 0 on top) × head (x) heatmap of one score.

    Plots the mean over sequences, or the scores of one ``sequence``. With ``threshold``, the
    heads the score calls inactive at τ *on the plotted values* are outlined (a scatter trace of
    open squares, one marker per flagged head). The inactive end of the color scale is dark for
    both directions ("above" scores use the reversed scale). ``label`` and ``direction`` default to
    the registered score's (a results folder's, :meth:`SweepResults.score_label`, for a score
    this process does not register; an unregistered score without them is drawn as "below").
    """
    label = label or score_label(key)
    if sequence is None:
        values = head_scores.mean(key)
        what = f"mean over {head_scores.n_sequences} sequences"
    else:
        if not -head_scores.n_sequences <= sequence < head_scores.n_sequences:
            raise OutOfRangeError(f"sequence {sequence} out of range; there are {head_scores.n_sequences} sequences")
        values = head_scores[key][sequence]
        what = f"sequence {sequence}"
    n_layers, n_heads = values.shape
    z = values.detach().double().numpy()
    if direction is None:
        direction = get_score(key).direction if is_registered(key) else "below"

    plot_w, plot_h = _grid_size(n_layers, n_heads)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            colorscale="Viridis_r" if direction == "above" else "Viridis",
            colorbar={"title": {"text": label, "side": "right"}, "thickness": 14},
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{label}: %{{z:.4g}}<extra></extra>",
            name=label,
        )
    )
    if threshold is not None:
        mask = flagged_heads(values, key, threshold, direction=direction)
        layers, heads = np.nonzero(mask.numpy())
        size = 0.82 * min(plot_w / n_heads, plot_h / n_layers)
        fig.add_trace(
            go.Scatter(
                x=heads.tolist(),
                y=layers.tolist(),
                mode="markers",
                marker={"symbol": "square-open", "size": size, "color": FLAG_COLOR, "line": {"width": 2.5}},
                name=f"inactive at τ = {float(threshold):.4g}: {len(heads)} of {n_layers * n_heads} heads",
                customdata=z[layers, heads],
                hovertemplate=f"layer %{{y}}, head %{{x}}<br>{label}: %{{customdata:.4g}} (inactive)<extra></extra>",
                showlegend=True,
            )
        )
    title = title or f"{label} per head, {what} ({_model_name(head_scores)})"
    return _grid_layout(fig, title, n_layers, n_heads, showlegend=threshold is not None)


def flag_rate_heatmap(
    head_scores: HeadScores, key: str, threshold: Real, *, title: str | None = None, label: str | None = None,
    direction: str | None = None,
) -> go.Figure:
    """Layer × head heatmap of the % of sequences on which each head is flagged inactive at τ.

    This is the per-sequence selection the ablation makes (here on the recorded scores, so
    without the cascade of earlier ablations): a head can be inactive on some inputs only.
    ``label`` and ``direction`` default to the registered score's.
    """
    label = label or score_label(key)
    rate = 100 * flagged_mask(head_scores, key, float(threshold), direction).double().mean(dim=0)
    n_layers, n_heads = rate.shape
    fig = go.Figure(
        go.Heatmap(
            z=rate.numpy(),
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            colorscale="Reds",
            zmin=0,
            zmax=100,
            colorbar={"title": {"text": "% of sequences", "side": "right"}, "thickness": 14, "ticksuffix": "%"},
            hovertemplate=(
                f"layer %{{y}}, head %{{x}}<br>inactive ({label} τ = {float(threshold):.4g}) "
                "on %{z:.1f}% of sequences<extra></extra>"
            ),
            name="% of sequences flagged",
        )
    )
    title = title or f"{label} at τ = {float(threshold):.4g}: % of {head_scores.n_sequences} sequences inactive"
    return _grid_layout(fig, title, n_layers, n_heads, showlegend=False)


def _grid_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    """Plot-area pixels for a layer × head grid: cells sized to the grid (12–48 px)."""
    cell = float(np.clip(min(640 / n_heads, 760 / n_layers), 12, 48))
    return max(n_heads * cell, 300.0), n_layers * cell


def _grid_layout(fig: go.Figure, title: str, n_layers: int, n_heads: int, *, showlegend: bool) -> go.Figure:
    plot_w, plot_h = _grid_size(n_layers, n_heads)
    margin = {"l": 60, "r": 20, "t": 90, "b": 60}
    _layout(
        fig,
        title,
        width=int(plot_w + margin["l"] + margin["r"] + 100),  # + the color bar
        height=int(plot_h + margin["t"] + margin["b"]),
        margin=margin,
        showlegend=showlegend,
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "bgcolor": "rgba(0,0,0,0)"},
    )
    fig.update_xaxes(title_text="head", dtick=1 if n_heads <= 32 else None, showgrid=False, zeroline=False,
                     range=[-0.5, n_heads - 0.5])
    # An explicit reversed range (layer 0 on top): autorange would pad for the outline markers.
    fig.update_yaxes(title_text="layer", range=[n_layers - 0.5, -0.5], dtick=1 if n_layers <= 32 else None,
                     showgrid=False, zeroline=False)
    return fig


def layer_profiles(head_scores: HeadScores, keys: Sequence[str] | None = None, *, columns: int = 3,
                   labels: Mapping[str, str] | None = None) -> go.Figure:
    """Small multiples, one panel per score: each head's mean score by layer (points, spread
    slightly within the layer) and the layer's mean over heads (line). ``labels``: score key ->
    label (default: the registered score's)."""
    keys = list(keys) if keys is not None else head_scores.keys()
    labels = {k: (labels or {}).get(k) or score_label(k) for k in keys}
    if not keys:
        raise UserError("layer_profiles needs at least one score key")
    missing = [k for k in keys if k not in head_scores]
    if missing:
        raise UnknownNameError(f"no scores for {missing} here; recorded: {', '.join(head_scores.keys())}")
    cols = max(1, min(columns, len(keys)))
    rows = math.ceil(len(keys) / cols)
    panel_h = 250
    height = rows * panel_h + 100
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[labels[k] for k in keys],
        vertical_spacing=min(0.3 / max(rows - 1, 1), 90 / height),
        horizontal_spacing=0.07,
    )
    n_layers, n_heads = head_scores.n_layers, head_scores.n_heads
    offsets = np.linspace(-0.3, 0.3, n_heads) if n_heads > 1 else np.zeros(1)
    layer_idx = np.arange(n_layers)
    for i, key in enumerate(keys):
        row, col = i // cols + 1, i % cols + 1
        mean = head_scores.mean(key).double().numpy()
        label, color = labels[key], score_color(key)
        x = (layer_idx[:, None] + offsets[None, :]).ravel()
        heads = np.broadcast_to(np.arange(n_heads), (n_layers, n_heads)).ravel()
        layers = np.repeat(layer_idx, n_heads)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=mean.ravel(),
                mode="markers",
                marker={"color": color, "size": 5, "opacity": 0.55},
                customdata=np.stack([layers, heads], axis=1),
                hovertemplate=(
                    f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{label}: %{{y:.4g}}<extra></extra>"
                ),
                name=f"{label}: heads",
                showlegend=False,
            ),
            row=row,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=layer_idx,
                y=mean.mean(axis=1),
                mode="lines",
                line={"color": color, "width": 2},
                hovertemplate=f"layer %{{x}}<br>{label}, layer mean: %{{y:.4g}}<extra></extra>",
                name=f"{label}: layer mean",
                showlegend=False,
            ),
            row=row,
            col=col,
        )
        bottom_of_column = i + cols >= len(keys)
        fig.update_xaxes(title_text="layer" if bottom_of_column else None, dtick=_layer_dtick(n_layers),
                         row=row, col=col)
        if col == 1:
            fig.update_yaxes(title_text="mean score", row=row, col=col)
    _layout(
        fig,
        "Per-layer profiles: each head's mean score (points) and the layer mean (line), "
        f"{_model_name(head_scores)}",
        height=height,
        margin={"l": 70, "r": 30, "t": 100, "b": 50},
    )
    fig.update_annotations(font_size=13)
    return fig


def _pool_sample(pool: Float[np.ndarray, " n"], max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted pool subsampled to evenly spaced order statistics: (values, ECDF heights)."""
    values = np.sort(pool)
    n = values.size
    idx = np.arange(n) if n <= max_points else np.unique(np.round(np.linspace(0, n - 1, max_points)).astype(int))
    return values[idx], (idx + 1) / n


def score_distributions(
    named_head_scores: Mapping[str, HeadScores] | HeadScores,
    key: str,
    *,
    kind: str = "ecdf",
    thresholds: Thresholds | Sequence[Real] | None = None,
    max_points: int = MAX_POINTS,
    title: str | None = None,
    label: str | None = None,
) -> go.Figure:
    """Distribution of one score pooled over (sequence, layer, head), one trace per model.

    ``kind="ecdf"`` (the curve the thresholds are read from) or ``"histogram"`` (density).
    Pools over ``max_points`` are subsampled deterministically to evenly spaced order
    statistics, which keeps the ECDF exact at the points shown. ``thresholds`` (a
    :class:`Thresholds` or plain numbers) are drawn as vertical lines. ``label`` defaults to the
    registered score's.
    """
    if kind not in ("ecdf", "histogram"):
        raise UserError(f"kind={kind!r} must be 'ecdf' or 'histogram'")
    if isinstance(named_head_scores, HeadScores):
        named_head_scores = {_model_name(named_head_scores): named_head_scores}
    if not named_head_scores:
        raise UserError("score_distributions needs at least one HeadScores")
    label = label or score_label(key)
    palette = qualitative.Plotly
    pools = {name: pooled_scores(hs, key) for name, hs in named_head_scores.items()}
    fig = go.Figure()
    if kind == "histogram":
        lo = min(float(p.min()) for p in pools.values())
        hi = max(float(p.max()) for p in pools.values())
        bins = {"start": lo, "end": hi, "size": (hi - lo) / 80 if hi > lo else 1.0}
    for i, (name, pool) in enumerate(pools.items()):
        x, y = _pool_sample(pool, max_points)
        color = palette[i % len(palette)] if len(pools) > 1 else score_color(key)
        if kind == "ecdf":
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line={"shape": "hv", "color": color, "width": 2},
                    name=f"{name} (N = {pool.size:,})",
                    hovertemplate=f"{name}<br>{label} ≤ %{{x:.4g}}: %{{y:.1%}}<extra></extra>",
                )
            )
        else:
            fig.add_trace(
                go.Histogram(
                    x=x,
                    xbins=bins,
                    histnorm="probability density",
                    marker={"color": color},
                    opacity=0.6 if len(pools) > 1 else 0.85,
                    name=f"{name} (N = {pool.size:,})",
                )
            )
    _add_threshold_lines(fig, thresholds)
    _layout(
        fig,
        title or f"Distribution of {label} over (sequence, layer, head)",
        height=460,
        barmode="overlay",
        margin={"l": 70, "r": 30, "t": 100, "b": 60},
        legend={"orientation": "h", "x": 0, "y": -0.18, "yanchor": "top"},
    )
    fig.update_xaxes(title_text=label)
    fig.update_yaxes(title_text="fraction ≤ x (ECDF)" if kind == "ecdf" else "density",
                     range=[0, 1.02] if kind == "ecdf" else None)
    return fig


def _add_threshold_lines(fig: go.Figure, thresholds: Thresholds | Sequence[Real] | None) -> None:
    if thresholds is None:
        return
    if isinstance(thresholds, Thresholds):
        lines = [(float(v), f"{p:.0%}") for p, v in thresholds.items()]
    else:
        lines = [(float(v), f"τ{i + 1}") for i, v in enumerate(thresholds)]
    for i, (value, text) in enumerate(lines):
        fig.add_vline(x=value, line={"color": "#555555", "width": 1, "dash": "dot"})
        # Neighbouring thresholds are often close: alternate label heights so they stay legible.
        fig.add_annotation(
            x=value, xref="x", y=1.0 + 0.06 * (i % 2), yref="paper", yanchor="bottom",
            text=text, showarrow=False, font={"size": 10, "color": "#555555"},
            hovertext=f"τ = {value:.4g}",
        )


def wasserstein_heatmap(named_head_scores: Mapping[str, HeadScores], key: str) -> go.Figure:
    """Annotated matrix of Wasserstein-1 distances between models' pooled distributions of ``key``
    (see :func:`inactive_heads.analysis.wasserstein`)."""
    if len(named_head_scores) < 1:
        raise UserError("wasserstein_heatmap needs at least one HeadScores")
    matrix = wasserstein_matrix(named_head_scores, key)
    names = [str(n) for n in matrix.index]
    z = matrix.to_numpy(dtype=float)
    label = score_label(key)
    side = 140 + 70 * len(names)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            text=[[f"{v:.3g}" for v in row] for row in z],
            texttemplate="%{text}",
            colorscale="Blues",
            zmin=0,
            colorbar={"title": {"text": "W1", "side": "right"}, "thickness": 14},
            hovertemplate="%{y} vs %{x}<br>W1 = %{z:.4g}<extra></extra>",
        )
    )
    _layout(fig, f"Wasserstein-1 distance between {label} distributions", width=side + 260, height=side + 120,
            margin={"l": 160, "r": 30, "t": 80, "b": 120})
    fig.update_yaxes(autorange="reversed")
    return fig


def iou_heatmap(head_scores: HeadScores, thresholds: Mapping[str, Real], *, labels: Mapping[str, str] | None = None,
                directions: Mapping[str, str] | None = None) -> go.Figure:
    """Annotated IoU matrix between the (sequence, layer, head) sets flagged by several scores,
    each at its own threshold (static: the recorded scores, no ablation cascade). ``labels`` and
    ``directions`` (score key -> each) default to the registered scores'."""
    keys = list(thresholds)
    if not keys:
        raise UserError("iou_heatmap needs thresholds for at least one score")
    masks = {k: flagged_mask(head_scores, k, float(thresholds[k]), (directions or {}).get(k)) for k in keys}
    n = len(keys)
    z = np.array([[iou(masks[a], masks[b]) for b in keys] for a in keys])
    labels = [(labels or {}).get(k) or score_label(k) for k in keys]
    pct = {k: 100 * float(masks[k].double().mean()) for k in keys}
    hover = [
        [
            f"{labels[i]} (τ = {float(thresholds[a]):.4g}, {pct[a]:.1f}% flagged)<br>"
            f"{labels[j]} (τ = {float(thresholds[b]):.4g}, {pct[b]:.1f}% flagged)<br>IoU = {z[i, j]:.3f}"
            for j, b in enumerate(keys)
        ]
        for i, a in enumerate(keys)
    ]
    side = 160 + 48 * n
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=labels,
            text=[[f"{v:.2f}" for v in row] for row in z],
            texttemplate="%{text}",
            textfont={"size": 11},
            hovertext=hover,
            hoverinfo="text",
            colorscale="Purples",
            zmin=0,
            zmax=1,
            colorbar={"title": {"text": "IoU", "side": "right"}, "thickness": 14},
        )
    )
    _layout(fig, "Agreement of flagged (sequence, layer, head) sets (IoU)", width=side + 300,
            height=side + 140, margin={"l": 160, "r": 30, "t": 80, "b": 120})
    fig.update_yaxes(autorange="reversed", ticklabelstandoff=6)
    fig.update_xaxes(tickangle=-40)
    return fig
