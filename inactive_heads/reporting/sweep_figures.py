"""Figures of a sweep's results: accuracy (or answer agreement) against the realized % of heads
zeroed, the normalized-AUC ranking, and the per-layer zeroing of one score; each returns a
``go.Figure``."""

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from ..analysis.curves import Points, Real, normalized_auc
from ..scoring.scores import score_label
from ..analysis.tables import BASELINE, runs_table
from ..sweep.results import SweepResults
from ..core.errors import UserError
from .style import BASELINE_COLOR, _layer_dtick, _layout, score_color, score_dash


def _sweep_points(results: SweepResults, metric: str = "accuracy") -> dict[str, list[tuple]]:
    """Per score: (realized %, value, p, τ, low, high) sorted by realized %, where value is the
    run's accuracy % or answer agreement % (``metric``) and [low, high] its 95 % interval."""
    table = runs_table(results).set_index("run_id")
    out: dict[str, list[tuple]] = {}
    for run_id, rec in results.records.items():
        if rec.score and run_id in table.index:
            row = table.loc[run_id]
            if metric == "agreement" and np.isnan(row["agreement"]):
                continue
            p, tau = rec.p, rec.threshold
            out.setdefault(rec.score, []).append(
                (float(rec.realized_percent), float(row[metric]),
                 None if p is None else float(p), None if tau is None else float(tau),
                 float(row[f"{metric}_low"]), float(row[f"{metric}_high"]))
            )
    return {k: sorted(out[k], key=lambda t: t[0]) for k in results.score_keys if k in out}


def _baseline_of(results: SweepResults) -> float | None:
    return results.baseline_percent if BASELINE in results.records else None


def accuracy_curves(
    sweep_results_or_curves: SweepResults | Mapping[str, Points],
    *,
    baseline: Real | None = None,
    tolerance: Real = 1.0,
    title: str | None = None,
    metric: str = "accuracy",
) -> go.Figure:
    """Accuracy (%) against the realized % of heads zeroed, one line per score function, with
    horizontal lines at the baseline and at baseline − ``tolerance`` (the Table 2 line).

    Pass a :class:`SweepResults` (baseline from its nothing-zeroed run unless given; each point
    gets an error bar, its 95 % bootstrap interval over questions) or a dict
    ``{score key: [(realized %, accuracy %), ...]}`` and ``baseline``. Without any baseline the
    reference lines are left out. ``metric="agreement"`` plots the answer agreement with the
    unablated model instead (SweepResults only; the reference lines are then 100 % and 99 %).
    """
    if metric not in ("accuracy", "agreement"):
        raise UserError(f"metric must be 'accuracy' or 'agreement'; got {metric!r}")
    if isinstance(sweep_results_or_curves, SweepResults):
        results = sweep_results_or_curves
        points = _sweep_points(results, metric)
        if metric == "agreement":
            baseline = 100.0
        elif baseline is None:
            baseline = _baseline_of(results)
        title = title or f"{results.config.model} on {results.config.task}: {metric} vs heads zeroed"
    else:
        if metric != "accuracy":
            raise UserError("metric='agreement' needs a SweepResults (the runs' log-likelihoods)")
        points = {
            k: [(float(x), float(y), None, None, None, None) for x, y in sorted((float(a), float(b)) for a, b in pts)]
            for k, pts in sweep_results_or_curves.items()
        }
    label = results.score_label if isinstance(sweep_results_or_curves, SweepResults) else score_label
    fig = go.Figure()
    for key, pts in points.items():
        if pts:
            fig.add_trace(_curve_trace(key, label(key), pts, metric))
    if baseline is not None:
        _reference_lines(fig, float(baseline), float(tolerance))
    _layout(
        fig,
        title or "Accuracy vs heads zeroed",
        height=540,
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        hovermode="closest",
        legend={"title": {"text": "score function"}, "itemclick": "toggle", "itemdoubleclick": "toggleothers"},
    )
    fig.update_xaxes(title_text="% of heads zeroed (realized)", rangemode="tozero")
    fig.update_yaxes(title_text=f"{metric} (%)")
    return fig


def _curve_trace(key: str, label: str, pts: list, metric: str) -> go.Scatter:
    """One score function's line: (realized %, value %, p, τ, interval low, high) per point, with
    error bars where every point has its interval."""
    custom = [
        (f"p = {p:.0%}, τ = {t:.4g}" if p is not None and t is not None else "")
        + (f"<br>95% interval {lo:.2f} to {hi:.2f}" if lo is not None else "")
        for _, _, p, t, lo, hi in pts
    ]
    has_bars = all(lo is not None for *_, lo, _ in pts)
    error_y = (
        {"type": "data", "symmetric": False, "array": [hi - y for _, y, *_, hi in pts],
         "arrayminus": [y - lo for _, y, *_, lo, _ in pts], "thickness": 1, "width": 3,
         "color": score_color(key)}
        if has_bars else None
    )
    return go.Scatter(
        x=[x for x, *_ in pts],
        y=[y for _, y, *_ in pts],
        mode="lines+markers",
        name=label,
        line={"color": score_color(key), "dash": score_dash(key), "width": 2.5 if key == "ahon_ln" else 1.8},
        marker={"size": 7, "color": score_color(key)},
        error_y=error_y,
        customdata=custom,
        hovertemplate=(
            f"<b>{label}</b><br>%{{x:.2f}}% zeroed<br>{metric} %{{y:.2f}}%<br>%{{customdata}}<extra></extra>"
        ),
    )


def _reference_lines(fig: go.Figure, base: float, tolerance: float) -> None:
    """The baseline and the baseline − ``tolerance`` line (Table 2's)."""
    fig.add_hline(
        y=base, line={"color": BASELINE_COLOR, "width": 1.5},
        annotation_text=f"baseline {base:.2f}%", annotation_position="top right",
    )
    fig.add_hline(
        y=base - tolerance, line={"color": BASELINE_COLOR, "width": 1.2, "dash": "dash"},
        annotation_text=f"baseline − {tolerance:g} pt", annotation_position="bottom right",
    )


def auc_ranking(
    sweep_results_or_curves: SweepResults | Mapping[str, Points],
    *,
    baseline: Real | None = None,
    title: str | None = None,
) -> go.Figure:
    """Dot plot of each score's normalized AUC (its mean accuracy over its own realized range,
    docs/concepts.md), best at the top, with the baseline accuracy as a vertical line."""
    label = score_label
    if isinstance(sweep_results_or_curves, SweepResults):
        curves = sweep_results_or_curves.curves()
        label = sweep_results_or_curves.score_label
        if baseline is None:
            baseline = _baseline_of(sweep_results_or_curves)
    else:
        curves = dict(sweep_results_or_curves)
    ranked = sorted(((k, normalized_auc(p)) for k, p in curves.items() if len(p)), key=lambda kv: -kv[1])
    fig = go.Figure(
        go.Scatter(
            x=[v for _, v in ranked],
            y=[label(k) for k, _ in ranked],
            mode="markers+text",
            marker={"size": 13, "color": [score_color(k) for k, _ in ranked], "line": {"width": 1, "color": "white"}},
            text=[f"{v:.2f}" for _, v in ranked],
            textposition="middle left",
            hovertemplate="%{y}: normalized AUC %{x:.3f}<extra></extra>",
            name="normalized AUC",
            showlegend=False,
        )
    )
    if baseline is not None:
        fig.add_vline(x=float(baseline), line={"color": BASELINE_COLOR, "width": 1.2, "dash": "dash"},
                      annotation_text=f"baseline {float(baseline):.2f}%", annotation_position="top left")
    values = [v for _, v in ranked] + ([float(baseline)] if baseline is not None else [])
    if values:
        lo, hi = min(values), max(values)
        pad = max(0.5, 0.08 * (hi - lo))
        fig.update_xaxes(range=[lo - 2.5 * pad, hi + pad])
    _layout(fig, title or "Ranking by normalized AUC (mean accuracy over each score's realized range)",
            height=max(260, 60 + 32 * len(ranked) + 80), margin={"l": 160, "r": 30, "t": 80, "b": 60})
    fig.update_xaxes(title_text="normalized AUC (accuracy %)")
    fig.update_yaxes(autorange="reversed", title_text=None)
    return fig


def realized_by_layer(sweep_results: SweepResults, key: str) -> go.Figure:
    """% of (sequence, head) pairs zeroed in each layer during the ablated runs of one score,
    one line per threshold (from the runs' ``realized_fraction_per_layer``)."""
    records = sorted(
        (r for r in sweep_results.records.values() if r.score == key),
        key=lambda r: (r.p is None, r.p or 0.0),
    )
    if not records and key not in sweep_results.config.scores + ["random"]:
        raise UserError(
            f"score '{key}' is not part of this sweep; it has {', '.join(sweep_results.score_keys) or 'no runs'}"
        )
    label = sweep_results.score_label(key)
    usable = [r for r in records if r.realized_fraction_per_layer]
    colors = sample_colorscale("Viridis", list(np.linspace(0.0, 0.85, max(len(usable), 2))))
    fig = go.Figure()
    for rec, color in zip(usable, colors):
        per_layer = [100 * float(f) for f in rec.realized_fraction_per_layer]
        p, tau = rec.p, rec.threshold
        name = f"p = {p:.0%}" if p is not None else rec.run_id
        if tau is not None:
            name += f", τ = {tau:.3g}"
        name += f" ({rec.realized_percent:.1f}% overall)"
        fig.add_trace(
            go.Scatter(
                x=list(range(len(per_layer))),
                y=per_layer,
                mode="lines+markers",
                name=name,
                line={"color": color, "width": 2},
                marker={"size": 5},
                hovertemplate=f"{name}<br>layer %{{x}}: %{{y:.1f}}% zeroed<extra></extra>",
            )
        )
    if not usable:
        fig.add_annotation(text=f"no finished run of {label} recorded per-layer zeroing", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
    _layout(fig, f"{label}: % of heads zeroed per layer, by threshold", height=440,
            margin={"l": 70, "r": 30, "t": 80, "b": 60}, legend={"title": {"text": "threshold"}})
    n_layers = max((len(r.realized_fraction_per_layer) for r in usable), default=1)
    fig.update_xaxes(title_text="layer", rangemode="tozero", dtick=_layer_dtick(n_layers))
    fig.update_yaxes(title_text="% of heads zeroed", rangemode="tozero")
    return fig
