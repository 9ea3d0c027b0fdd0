"""One self-contained HTML report of a sweep folder, and a plain-text summary for the terminal.

>>> path = write_report("results/smollm2-mmlu")          # doctest: +SKIP
>>> print(format_table(SweepResults.load("results/smollm2-mmlu")))  # doctest: +SKIP

The report embeds plotly.js once, inline, so it opens offline (no CDN). It reads everything from
the folder (``sweep.json``, ``thresholds.json``, ``runs/*.json`` and, when present,
``scores.safetensors``), so it can be rewritten at any time, also for a sweep that is still running: the
missing runs are listed and every table and figure uses the runs that finished. The plain-text
summary (``format_table``) is written in ``summary_text`` and the cell formatting both share in
``cells``; this module publishes both.
"""

import html
import math
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pandas as pd
import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from . import plots
from ..core.io import write_text_atomic
from ..analysis.bootstrap import (
    DEFAULT_RESAMPLES,
    Real,
    accuracy_interval,
)
from ..scoring.calibration import Thresholds, calibrate
from ..scoring.recording import HeadScores, toolkit_version
from ..analysis.tables import AGREEMENT_TOLERANCE, BASELINE, NOT_REACHED, missing_runs, resolution_note, runs_table, summary_table, tolerance_text as _tol  # noqa: F401
from ..sweep.results import SweepResults
from .cells import _bound, _ci, _fmt, _max_pct_range, _n_questions, _partial_note, _range
from .summary_text import format_table

HEATMAP_P = 0.30
"""The nominal fraction whose threshold outlines heads in the report's heatmap (the paper's largest)."""
FIGURE_CONFIG = {"displaylogo": False, "responsive": True}


# ----------------------------------------------------------------------------------------------
# HTML


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif;
       color: #222; margin: 0; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.25em; margin: 2em 0 0.4em; border-bottom: 1px solid #e3e5e8; padding-bottom: 0.2em; }
p.caption { color: #555; max-width: 60em; margin: 0.3em 0 0.8em; line-height: 1.45; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0.25em 1.2em; margin: 0.5em 0 1em; }
dl.meta dt { color: #666; } dl.meta dd { margin: 0; }
.note { background: #fff7e0; border-left: 4px solid #f0b400; padding: 0.6em 1em; margin: 1em 0; }
table.data { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.92em; }
table.data th, table.data td { padding: 0.3em 0.8em; border-bottom: 1px solid #e6e8eb; text-align: left; }
table.data th { background: #f2f4f6; font-weight: 600; }
table.data td.num, table.data th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data tr.best td { font-weight: 600; background: #eefaf7; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px; margin-right: 0.4em;
          vertical-align: -0.05em; }
.figure { margin: 0.5em 0 1.5em; overflow-x: auto; max-width: 100%; }
.row { display: flex; flex-wrap: wrap; gap: 0 24px; align-items: flex-start; }
footer { color: #777; font-size: 0.85em; margin-top: 3em; }
code { background: #f2f4f6; padding: 0 0.25em; border-radius: 3px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool],
                row_classes: Sequence[str] | None = None, table_id: str | None = None) -> str:
    """Header and cells are HTML already (escape before)."""
    head = "".join(f'<th class="num">{h}</th>' if num else f"<th>{h}</th>" for h, num in zip(header, numeric))
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, num in zip(row, numeric))
        body.append(f"<tr{cls}>{cells}</tr>")
    ident = f' id="{table_id}"' if table_id else ""
    return f'<table class="data"{ident}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _figure(fig: go.Figure, div_id: str) -> str:
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=FIGURE_CONFIG)
    # Fixed-size figures (heatmaps) keep their size, so two of them can sit side by side.
    style = f' style="width:{int(fig.layout.width)}px"' if fig.layout.width else ""
    return f'<div class="figure"{style}>{body}</div>'


def _swatch(key: str) -> str:
    return f'<span class="swatch" style="background:{plots.score_color(key)}"></span>'


def _best_key(frame: pd.DataFrame) -> str | None:
    """The score with the most heads zeroed within tolerance (ties: better AUC), Random last. A
    censored max-% ranks by its bound (``max_pct_within`` holds it): a bound equal to another
    score's value ties with it, and the AUC breaks the tie."""
    if frame.empty:
        return None
    candidates = frame[frame["score"] != "random"] if (frame["score"] != "random").any() else frame
    ordered = candidates.assign(_w=candidates["max_pct_within"].fillna(-1.0)).sort_values(
        ["_w", "normalized_auc"], ascending=[False, False], kind="stable"
    )
    return str(ordered.iloc[0]["score"])


def _header_html(results: SweepResults) -> str:
    cfg = results.config
    subjects = "all" if not cfg.subjects else ", ".join(cfg.subjects[:8]) + (
        f" … ({len(cfg.subjects)} subjects)" if len(cfg.subjects) > 8 else ""
    )
    finished = [r.finished_at for r in results.records.values() if r.finished_at]
    n = _n_questions(results)
    total = len(cfg.run_ids())
    items = [
        ("model", f"<code>{_e(cfg.model)}</code>"),
        ("task", _e(cfg.task)),
        ("subjects", _e(subjects)),
        ("limit", _e(cfg.limit if cfg.limit is not None else "none")),
        ("questions (n)", _e(n if n is not None else "—")),
        ("dtype / backend", _e(f"{cfg.dtype} / {cfg.backend}")),
        ("thresholds", _e(cfg.thresholds)),
        ("runs finished", _e(f"{len(results.records)} of {total}")),
        ("last run finished", _e(max(finished) if finished else "—")),
        ("report written", _e(datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))),
        ("toolkit version", _e(f"inactive-heads {toolkit_version()}")),
        ("results folder", f"<code>{_e(results.path)}</code>"),
    ]
    meta = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return f'<h1>Inactive heads: {_e(cfg.model)} on {_e(cfg.task)}</h1>\n<dl class="meta">{meta}</dl>'


def _summary_html(results: SweepResults, frame: pd.DataFrame, tolerance: Real) -> str:
    parts = ['<h2 id="summary">Max % of heads zeroed within ' f"{_e(_tol(tolerance))} of the baseline</h2>"]
    has_baseline = BASELINE in results.records
    if has_baseline:
        parts.append(
            f'<p class="caption">Baseline accuracy (nothing zeroed): <b>{results.baseline_percent:.2f}%</b>'
            f"{_baseline_interval_html(results)}. "
            "For each score, the largest realized % of (sequence, layer, head) triples zeroed while accuracy "
            f"stays within {_e(_tol(tolerance))} (absolute) of the baseline: the last crossing of its "
            "piecewise-linear curve with the line baseline − tolerance (the paper's Table 2 statistic). "
            "A curve that stays above the line at every % zeroed tested never reached it: its value is a "
            "lower bound, marked ≥ (the largest % tested; add larger quantiles to find it), where the "
            "paper's rule would count 0. Rows are ordered by this value or bound (ties: better AUC).</p>"
        )
    if frame.empty:
        parts.append("<p>No ablation run has finished yet.</p>")
        return "\n".join(parts)
    ordered = frame.assign(_w=frame["max_pct_within"].fillna(-1.0)).sort_values(
        ["_w", "normalized_auc"], ascending=[False, False], kind="stable"
    )
    best = _best_key(frame)
    n_planned = len(results.config.quantiles)
    rows, classes = [], []
    for _, r in ordered.iterrows():
        rows.append([
            f"{_swatch(r['score'])}{_e(r['label'])}",
            f"<code>{_e(r['score'])}</code>",
            _max_pct_html(r, "max_pct_within"),
            _e(_max_pct_range(r, "max_pct_within")),
            _fmt(r["normalized_auc"]),
            _e(_range(r["auc_low"], r["auc_high"])),
            str(int(r["rank"])),
            _max_pct_html(r, "max_pct_agree"),
            _e(_max_pct_range(r, "max_pct_agree")),
            _fmt(r["max_realized_pct"]),
            f"{int(r['points'])} / {n_planned}",
        ])
        classes.append("best" if r["score"] == best and has_baseline else "")
    header = ["score", "key", f"max % zeroed within {_e(_tol(tolerance))}", "95% interval", "normalized AUC",
              "95% interval", "AUC rank", f"max % zeroed, agreement ≥ {100 - AGREEMENT_TOLERANCE:g}%",
              "95% interval", "max realized %", "runs"]
    numeric = [False, False] + [True] * 9
    parts.append(_html_table(header, rows, numeric, classes, "max-within"))
    parts.append(
        '<p class="caption">Intervals: 95% percentile intervals of a paired bootstrap over questions '
        f"({DEFAULT_RESAMPLES} resamples, the same for every run: each resample recomputes every run's "
        "accuracy, then each curve, then its statistic; a resample whose curve does not reach the line "
        "counts as the bound, above every resample that does, so an interval end among them is a bound "
        "too, marked ≥). Answer agreement: % of questions whose chosen "
        "answer (largest log-likelihood) is the one chosen with nothing zeroed; it needs no labels.</p>"
    )
    note = resolution_note(results, tolerance)
    if note:
        parts.append(f'<div class="note">Sample size: {_e(note[0].upper() + note[1:])}</div>')
    if has_baseline and "awft" in set(frame["score"]) and len(frame) > 1:
        awft = frame.loc[frame["score"] == "awft"].iloc[0]
        others = frame[frame["score"] != "awft"]
        top = others.loc[others["max_pct_within"].idxmax()]  # frame is in AUC order: ties go to the better AUC
        parts.append(
            f'<p class="caption">Best score other than AWFT: <b>{_e(top["label"])}</b>, '
            f"{_e(_percent_zeroed(top, tolerance))}, against {_e(_percent_zeroed(awft, tolerance))} "
            f"for AWFT ({_e(_difference(top, awft))}).</p>"
        )
    return "\n".join(parts)


def _max_pct_html(r: pd.Series, stat: str) -> str:
    """A max-% cell of the HTML table: the number, or "≥ bound (not reached: add larger quantiles)"."""
    if r[stat] is None or math.isnan(r[stat]):
        return "—"
    if r[f"{stat}_censored"]:
        return f"{_e(_bound(r[stat], True, 2))} <small>({_e(NOT_REACHED)})</small>"
    return _fmt(r[stat])


def _percent_zeroed(r: pd.Series, tolerance: Real) -> str:
    text = f"{_bound(r['max_pct_within'], r['max_pct_within_censored'], 2)}% zeroed within {_tol(tolerance)}"
    return f"{text} ({NOT_REACHED})" if r["max_pct_within_censored"] else text


def _difference(top: pd.Series, awft: pd.Series) -> str:
    """top − AWFT in points; a lower bound on either side bounds the difference or leaves it open."""
    d = top["max_pct_within"] - awft["max_pct_within"]
    top_bound, awft_bound = bool(top["max_pct_within_censored"]), bool(awft["max_pct_within_censored"])
    if top_bound and awft_bound:
        return "difference not determined: neither curve reached its line"
    if top_bound:
        return f"difference at least {d:+.2f} points"
    if awft_bound:
        return f"difference at most {d:+.2f} points: AWFT's curve did not reach its line"
    return f"difference {d:+.2f} points"


def _baseline_interval_html(results: SweepResults) -> str:
    rec = results.records.get(BASELINE)
    if not rec or not rec.correct:
        return ""
    ci = accuracy_interval(rec.correct)
    return f" (95% interval {ci.low:.2f} to {ci.high:.2f}, n = {len(rec.correct)} questions)"


def _runs_html(results: SweepResults) -> str:
    table = runs_table(results)
    if table.empty:
        return ""
    parts = ['<h2 id="runs">Every run, with 95% intervals</h2>',
             '<p class="caption">Accuracy; its paired difference from the baseline (the same questions, '
             "so only the answers the ablation changed move it); answer agreement with the unablated "
             "model; mean KL(unablated ‖ ablated) between the distributions over the answer choices "
             "(softmax of the choice log-likelihoods), in nats."
             + (" The sweep's fixed ablations (one run each, named by kind and a hash of the spec) are single "
                "points here, not curves." if results.ablation_keys else "") + "</p>"]
    rows = [
        [f"<code>{_e(r['run_id'])}</code>", _e(r["label"]), _fmt(r["realized_pct"]),
         _e(_ci(r["accuracy"], r["accuracy_low"], r["accuracy_high"], 2)),
         _e(_ci(r["difference"], r["difference_low"], r["difference_high"], 2)),
         _e(_ci(r["agreement"], r["agreement_low"], r["agreement_high"], 2)),
         _e(_ci(r["kl"], r["kl_low"], r["kl_high"], 4))]
        for _, r in table.iterrows()
    ]
    header = ["run", "score", "% zeroed", "accuracy % [95%]", "vs baseline, points [95%]",
              "agreement % [95%]", "KL, nats [95%]"]
    parts.append(_html_table(header, rows, [False, False] + [True] * 5, table_id="runs-table"))
    return "\n".join(parts)


def _thresholds_html(results: SweepResults) -> str:
    parts = ['<h2 id="thresholds">Thresholds</h2>']
    if not results.thresholds:
        parts.append("<p>No <code>thresholds.json</code> in the results folder yet.</p>")
        return "\n".join(parts)
    ps = sorted({p for t in results.thresholds.values() for p in t.quantiles})
    parts.append(
        '<p class="caption">τ<sub>p</sub> per score: the p-quantile of the pooled (sequence, layer, head) '
        "scores recorded with nothing zeroed (1 − p for the “above” scores; Random uses p itself). "
        "One global τ per score, applied per sequence in every layer.</p>"
    )
    rows = []
    for key, t in results.thresholds.items():
        by_p = dict(t.items())
        op = "&gt;" if t.direction == "above" else "&lt;"
        rows.append(
            [f"{_swatch(key)}{_e(results.score_label(key))}", f"inactive if {op} τ"]
            + [_e(f"{by_p[p]:.4g}") if p in by_p else "—" for p in ps]
            + [_e(t.source), _e(f"{t.n_scores:,}" if t.n_scores else "—")]
        )
    header = ["score", "direction"] + [f"p = {p:.0%}" for p in ps] + ["source", "pool size"]
    numeric = [False, False] + [True] * len(ps) + [False, True]
    parts.append(_html_table(header, rows, numeric, table_id="thresholds-table"))
    return "\n".join(parts)


def _threshold_at(results: SweepResults, head_scores: HeadScores, key: str, p: Real) -> float:
    """τ_p from the sweep's thresholds, else calibrated here on the recorded scores."""
    thresholds = results.thresholds.get(key)
    if thresholds is not None:
        try:
            return thresholds.at(p)
        except KeyError:
            pass
    return calibrate(head_scores, key, [p], direction=results.score_direction(key)).values[0]


def _scores_html(results: SweepResults) -> str:
    path = results.scores_path
    if path is None:
        return ""
    parts = ['<h2 id="scores">Recorded head scores (nothing zeroed)</h2>']
    try:
        hs = results.head_scores()
    except (OSError, ValueError, RuntimeError) as err:
        parts.append(f'<div class="note">Could not read <code>{_e(path)}</code>: {_e(err)}</div>')
        return "\n".join(parts)
    key = "ahon_ln" if "ahon_ln" in hs else hs.keys()[0]
    label, direction = results.score_label(key), results.score_direction(key)
    t = results.thresholds.get(key)
    tau = _threshold_at(results, hs, key, HEATMAP_P)
    op = ">" if direction == "above" else "<"
    parts.append(
        f'<p class="caption">{hs.n_sequences:,} sequences × {hs.n_layers} layers × {hs.n_heads} heads, '
        f"recorded on the evaluation inputs. Heatmap: each head's {_e(label)} averaged over sequences; "
        f"outlined are the heads whose average is {_e(op)} τ<sub>{HEATMAP_P:.0%}</sub> = {tau:.4g}. "
        "The ablation itself flags heads per sequence, so a head can be zeroed on some inputs and "
        "not on others: the second heatmap shows on what % of the sequences each head is flagged at "
        "the same τ (on the recorded scores, so without the cascade of earlier ablations).</p>"
    )
    parts.append(
        '<div class="row">'
        + _figure(plots.score_heatmap(hs, key, threshold=tau, title=f"{label}: mean over sequences",
                                      label=label, direction=direction), "fig-heatmap")
        + _figure(plots.flag_rate_heatmap(hs, key, tau, title=f"{label} {op} τ: % of sequences",
                                          label=label, direction=direction), "fig-flag-rate")
        + "</div>"
    )
    parts.append(
        '<p class="caption">The pooled distribution the thresholds are read from, with τ<sub>p</sub> '
        "marked (labels: p).</p>"
    )
    parts.append(_figure(plots.score_distributions(hs, key, thresholds=t, label=label), "fig-distribution"))
    keys = [k for k in results.config.scores if k in hs] or hs.keys()
    labels = {k: results.score_label(k) for k in keys}
    parts.append(_figure(plots.layer_profiles(hs, keys, labels=labels), "fig-layer-profiles"))
    iou_keys = {k: _threshold_at(results, hs, k, HEATMAP_P) for k in keys}
    if len(iou_keys) >= 2:
        parts.append(
            '<p class="caption">How much the scores agree: IoU of the (sequence, layer, head) sets each '
            f"flags at its τ<sub>{HEATMAP_P:.0%}</sub> on the recorded scores (no ablation cascade).</p>"
        )
        parts.append(_figure(plots.iou_heatmap(hs, iou_keys, labels=labels,
                                               directions={k: results.score_direction(k) for k in keys}), "fig-iou"))
    return "\n".join(parts)


def _savings_html(results: SweepResults) -> str:
    """Per ablated run: accuracy beside what skipping its zeroed heads would save (estimated)."""
    runs = [(rid, rec) for rid, rec in results.records.items() if rec.oracle_savings]
    if not runs:
        return ""
    parts = ['<h2 id="savings">What skipping the zeroed heads would save (estimated)</h2>',
             '<p class="caption">Per run, averaged over its inputs: the % of query heads zeroed, of key/value '
             "heads removable (every query head of the group zeroed), of the prefill FLOPs of attention and "
             "projections at each input's length, and of the KV-cache bytes, if a runtime skipped exactly the "
             "heads each input had zeroed (an oracle: the toolkit still computes them, then zeroes them). "
             "Static runs remove one set for every input, so an exported model saves the same "
             "(<code>ih.savings</code>, <code>ih.export_pruned</code>).</p>"]
    rows = []
    for rid, rec in runs:
        ci = accuracy_interval(rec.correct)
        o = rec.oracle_savings
        rows.append([f"<code>{_e(rid)}</code>", _e(rec.label or rec.score),
                     _e(_ci(ci.estimate, ci.low, ci.high, 2)), _fmt(o["query_heads_pct"]), _fmt(o["kv_heads_pct"]),
                     _fmt(o["prefill_flops_removed_pct"]), _fmt(o["kv_cache_removed_pct"])])
    header = ["run", "score", "accuracy % [95%]", "query heads %", "KV heads removable %", "prefill FLOPs %",
              "KV cache %"]
    parts.append(_html_table(header, rows, [False, False] + [True] * 5, table_id="savings-table"))
    return "\n".join(parts)


def render_report(results: SweepResults, *, tolerance: Real = 1.0) -> str:
    """The report as one HTML string (plotly.js inline)."""
    frame = summary_table(results, tolerance)
    has_baseline = BASELINE in results.records
    body = [_header_html(results)]
    note = _partial_note(results)
    if note:
        body.append(f'<div class="note">{_e(note[0].upper() + note[1:])}</div>')
    body.append(_summary_html(results, frame, tolerance))
    if not frame.empty:
        body.append('<h2 id="curves">Accuracy vs % of heads zeroed</h2>')
        body.append(
            '<p class="caption">One point per threshold τ<sub>p</sub>; x is the realized % of (sequence, layer, '
            "head) triples zeroed during the ablated run (not the nominal p). Solid lines: layer-normalized "
            "(LN) scores; dashed: raw; dotted: HN and Random; error bars: 95% bootstrap intervals over questions. Click a legend entry to hide it, double-click "
            "to show it alone.</p>"
        )
        body.append(_figure(plots.accuracy_curves(results, tolerance=tolerance), "fig-curves"))
        if frame["max_pct_agree"].notna().any():
            body.append('<h2 id="agreement">Answer agreement with the unablated model vs % of heads zeroed</h2>')
            body.append(
                '<p class="caption">% of questions whose chosen answer is unchanged by the ablation, with '
                "95% intervals. It needs no labels and is paired by construction, so it separates score "
                "functions even where accuracy sits near chance. Dashed line: 99% agreement.</p>"
            )
            body.append(_figure(plots.accuracy_curves(results, tolerance=AGREEMENT_TOLERANCE, metric="agreement"),
                                "fig-agreement"))
        body.append('<h2 id="ranking">Ranking by normalized AUC</h2>')
        body.append(
            '<p class="caption">Area under each accuracy curve divided by its own realized x-span: the mean '
            "accuracy over the range of % zeroed that the score reached (the paper's Fig. 3 ranking)."
            + (" The dashed line is the baseline accuracy." if has_baseline else "")
            + "</p>"
        )
        body.append(_figure(plots.auc_ranking(results), "fig-ranking"))
    body.append(_runs_html(results))
    body.append(_savings_html(results))
    body.append(_thresholds_html(results))
    best = _best_key(frame)
    if best is not None:
        body.append(f'<h2 id="by-layer">Where the zeroing happens: {_e(results.score_label(best))} by layer</h2>')
        why = (
            f"the score with the most heads zeroed within {_e(_tol(tolerance))}"
            if has_baseline
            else "the best score by normalized AUC (no baseline run yet)"
        )
        top = frame.loc[frame["score"] == best].iloc[0]
        if has_baseline and top["max_pct_within_censored"]:
            why += (f" as far as the tested range shows: its ≥ {top['max_pct_within']:.2f}% is a lower bound "
                    "(a bound ranks by its value; ties: better AUC)")
        body.append(
            f'<p class="caption">{_e(results.score_label(best))} is {why}. Per layer, the % of (sequence, head) '
            "pairs it zeroed in each ablated run.</p>"
        )
        body.append(_figure(plots.realized_by_layer(results, best), "fig-by-layer"))
    body.append(_scores_html(results))
    body.append(
        f"<footer>Written by inactive-heads {_e(toolkit_version())} with plotly {_e(plotly.__version__)} "
        "(plotly.js embedded; the file opens offline).</footer>"
    )
    title = f"Inactive heads: {results.config.model} on {results.config.task}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{_e(title)}</title>\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<style>{_CSS}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>\n"
        f"<body>\n<main>\n{chr(10).join(p for p in body if p)}\n</main>\n</body>\n</html>\n"
    )


def write_report(
    results_dir: str | os.PathLike,
    out_path: str | os.PathLike | None = None,
    *,
    tolerance: Real = 1.0,
) -> Path:
    """Write the HTML report of the sweep in ``results_dir`` (default ``<results_dir>/report.html``),
    atomically (temp file + rename); returns its path."""
    results = SweepResults.load(results_dir)
    out = Path(out_path) if out_path is not None else Path(results_dir) / "report.html"
    text = render_report(results, tolerance=tolerance)
    return write_text_atomic(out, text)


__all__ = [
    "format_table", "missing_runs", "render_report", "resolution_note", "runs_table", "summary_table", "write_report",
]
