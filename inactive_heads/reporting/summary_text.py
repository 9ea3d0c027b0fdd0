"""The plain-text summary of a sweep folder for the terminal (``format_table``).

>>> print(format_table(SweepResults.load("results/smollm2-mmlu")))  # doctest: +SKIP
"""

import math
import os

import pandas as pd

from ..analysis.bootstrap import DEFAULT_RESAMPLES, Real, accuracy_interval
from ..analysis.tables import AGREEMENT_TOLERANCE, BASELINE, NOT_REACHED, resolution_note, runs_table, summary_table, tolerance_text as _tol
from ..core.text import text_table
from ..sweep.results import SweepResults
from .cells import _bound, _ci, _fmt, _load, _max_pct, _n_questions, _partial_note


def _censoring_lines(frame: pd.DataFrame, names: dict[str, str]) -> list[str]:
    """One line per score whose max-% (``names``: statistic -> what it is called) is a lower bound
    or has resamples that did not reach the line: what was not reached, and how many resamples."""
    lines = []
    for _, r in frame.iterrows():
        said = []
        for stat, name in names.items():
            if r[stat] is None or math.isnan(r[stat]) or not r[f"{stat}_uncrossed"] > 0:
                continue
            counted = f"{int(r[f'{stat}_uncrossed'])} of {DEFAULT_RESAMPLES} resamples did not reach the line"
            if r[f"{stat}_censored"]:
                said.append(f"{name} {_bound(r[stat], True, 1)} ({NOT_REACHED}), {counted}")
            else:
                said.append(f"{name}: {counted}")
        if said:
            lines.append(f"  {r['label']}: " + "; ".join(said))
    if not lines:
        return []
    return ["≥: a lower bound. A curve that stays within its line up to the largest % zeroed tested never "
            "reached it: its value is at least that %. Resamples that do not reach the line count as that "
            "bound, above every resample that does, and an interval end among them is a bound too.", *lines]


def format_table(
    results: SweepResults | str | os.PathLike, *, tolerance: Real = 1.0, runs: bool = False
) -> str:
    """Plain-text summary: the baseline accuracy with its 95 % interval (and a note when the
    sample cannot resolve ``tolerance`` points), then one row per score ranked by normalized AUC:
    max % zeroed within ``tolerance`` points, normalized AUC, max % zeroed with ≥ 99 % answer
    agreement (each with its 95 % interval) and the max realized %. ``runs=True`` adds one row
    per run: accuracy, paired difference from the baseline, agreement and KL, with intervals."""
    results = _load(results)
    cfg = results.config
    n = _n_questions(results)
    lines = [f"{cfg.model} on {cfg.task}" + (f" ({n} questions)" if n is not None else "")]
    base = results.records.get(BASELINE)
    if base and base.correct:
        ci = accuracy_interval(base.correct)
        lines.append(f"baseline accuracy (nothing zeroed): {ci.estimate:.2f}% (95% interval {ci.low:.2f} to {ci.high:.2f})")
        note = resolution_note(results, tolerance)
        if note:
            lines.append(f"note: {note}")
    elif base:
        lines.append(f"baseline accuracy (nothing zeroed): {results.baseline_percent:.2f}%")
    else:
        lines.append("baseline accuracy (nothing zeroed): not run yet")
    note = _partial_note(results)
    if note:
        lines.append(f"note: {note}")
    frame = summary_table(results, tolerance)
    if frame.empty:
        if not results.ablation_keys:
            lines.append("no ablation run has finished yet.")
        elif results.config.scores or results.config.include_random:  # curves planned, none finished
            lines.append("no score curve has finished yet.")
        lines += _ablations_text(results)
        return "\n".join(lines)
    header = ["rank", "score", f"max % zeroed within {_tol(tolerance)}", "normalized AUC",
              f"max % zeroed, agreement >= {100 - AGREEMENT_TOLERANCE:g}%", "max realized %"]
    rows = [
        [str(int(r["rank"])), str(r["label"]),
         _max_pct(r, "max_pct_within"),
         _ci(r["normalized_auc"], r["auc_low"], r["auc_high"]),
         _max_pct(r, "max_pct_agree"),
         _fmt(r["max_realized_pct"])]
        for _, r in frame.iterrows()
    ]
    lines += ["", text_table(header, rows, left={1})]
    lines.append("[low, high]: 95% paired bootstrap intervals over questions "
                 f"({DEFAULT_RESAMPLES} resamples); agreement: same chosen answer as with nothing zeroed.")
    lines += _censoring_lines(frame, {"max_pct_within": f"within {_tol(tolerance)}",
                                      "max_pct_agree": f"agreement >= {100 - AGREEMENT_TOLERANCE:g}%"})
    lines += _ablations_text(results)
    if runs:
        table = runs_table(results)
        header = ["run", "score", "% zeroed", "accuracy %", "vs baseline (pt)", "agreement %", "KL (nats)"]
        rows = [
            [str(r["run_id"]), str(r["label"]), _fmt(r["realized_pct"]),
             _ci(r["accuracy"], r["accuracy_low"], r["accuracy_high"]),
             _ci(r["difference"], r["difference_low"], r["difference_high"]),
             _ci(r["agreement"], r["agreement_low"], r["agreement_high"]),
             _ci(r["kl"], r["kl_low"], r["kl_high"], 3)]
            for _, r in table.iterrows()
        ]
        lines += ["", text_table(header, rows, left={1})]
    return "\n".join(lines)


def _ablations_text(results: SweepResults) -> list[str]:
    """The sweep's fixed ablations (``SweepConfig.ablations``): one run each, so one point each,
    never a curve: % zeroed, accuracy and paired difference from the baseline with 95 % intervals."""
    keys = results.ablation_keys
    if not keys:
        return []
    table = runs_table(results).set_index("run_id")
    rows = [[str(k), str(table.loc[k, "label"]), _fmt(table.loc[k, "realized_pct"]),
             _ci(table.loc[k, "accuracy"], table.loc[k, "accuracy_low"], table.loc[k, "accuracy_high"]),
             _ci(table.loc[k, "difference"], table.loc[k, "difference_low"], table.loc[k, "difference_high"])]
            for k in keys]
    header = ["run", "ablation", "% zeroed", "accuracy %", "vs baseline (pt)"]
    return ["", "fixed ablations (one run each, a single point):", text_table(header, rows, left={0, 1})]
