"""The sweep's tables: one row per score (ranked, with intervals) and one row per run.

They read a sweep's run records (any object with ``records``, ``config.run_ids()``,
``score_keys``, ``score_label`` and ``path``, as :class:`inactive_heads.SweepResults` has) and compute every
interval with the paired bootstrap of :mod:`inactive_heads.analysis.paired`. The report, the plots and the
command line show these tables; none computes them again.
"""

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from ..scoring.calibration import Real
from .bootstrap import (
    DEFAULT_RESAMPLES,
    accuracy_interval,
    bootstrap_counts,
    bootstrap_indices,
    percentile_interval,
    questions_to_resolve,
)
from .curves import auc_ranks
from .paired import CENSORING_COLUMNS, answer_agreement, choice_kl, curve_intervals
from ..core.errors import UserError

BASELINE = "baseline"
"""The run id of the unablated run every other run is compared with."""


@runtime_checkable
class RunRecords(Protocol):
    """What the tables read of a sweep (``SweepResults`` is one)."""

    path: Any
    records: dict[str, Any]  # run id -> RunRecord (inactive_heads.sweep.record)
    config: Any
    score_keys: list[str]

    def score_label(self, key: str) -> str:
        """The label of a score curve as the results say it (not the registry's)."""


def tolerance_text(tolerance: Real) -> str:
    return f"{tolerance:g} pt"


COLUMNS = [
    "score", "label", "max_pct_within", "max_pct_within_low", "max_pct_within_high", *CENSORING_COLUMNS,
    "normalized_auc", "auc_low", "auc_high", "max_pct_agree", "max_pct_agree_low", "max_pct_agree_high",
    *(c.replace("max_pct_within", "max_pct_agree") for c in CENSORING_COLUMNS), "max_realized_pct", "points", "rank",
]



NOT_REACHED = "not reached: add larger quantiles"
"""What a censored max-% says beside its bound ("≥ 29.1 (not reached: add larger quantiles)"): the
curve stayed within its line up to the largest % zeroed tested, so the value is at least that."""

AGREEMENT_TOLERANCE = 1.0
"""Points of answer agreement an ablation may lose: "max % zeroed with ≥ 99 % agreement"."""


def _record_arrays(results: RunRecords) -> tuple[dict[str, dict[str, np.ndarray]], int | None]:
    """Per finished run: ``correct`` (in %), and, when the records and the baseline keep their
    log-likelihoods, ``agree`` (in %) and ``kl`` (nats) against the baseline, per question."""
    key = tuple(sorted(results.records))
    cached = getattr(results, "_question_arrays", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    base = results.records.get(BASELINE)
    base_ll = base.loglikelihoods if base else None
    sizes = {len(rec.correct) for rec in results.records.values() if rec.correct}
    if len(sizes) > 1:
        raise UserError(
            f"the runs in '{results.path}' answered different numbers of questions ({sorted(sizes)}); "
            "they are not one sweep: re-run it into a fresh --out folder"
        )
    out: dict[str, dict[str, np.ndarray]] = {}
    for run_id, rec in results.records.items():
        if not rec.correct:
            continue
        arrays = {"correct": 100.0 * np.asarray(rec.correct, dtype=np.float64)}
        ll = rec.loglikelihoods
        if base_ll is not None and ll is not None:
            arrays["agree"] = 100.0 * answer_agreement(ll, base_ll)
            arrays["kl"] = choice_kl(ll, base_ll)
        out[run_id] = arrays
    value = out, (sizes.pop() if sizes else None)
    results._question_arrays = (key, value)  # read once per RunRecords (the report reads it often)
    return value


def summary_table(
    results: RunRecords,
    tolerance: Real = 1.0,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per score, ranked by normalized AUC (1 = best), with paired bootstrap intervals.

    Columns: ``score, label``; ``max_pct_within`` (the largest realized % zeroed with accuracy
    within ``tolerance`` points of the baseline; NaN before the baseline run) with
    ``max_pct_within_low/high``; ``normalized_auc`` with ``auc_low/high``; ``max_pct_agree``
    (the largest % zeroed with answer agreement ≥ 100 − 1 %; NaN when the records keep no
    log-likelihoods) with ``max_pct_agree_low/high``; ``max_realized_pct``, ``points``, ``rank``.
    Intervals are 95 % percentile intervals of ``n_resamples`` resamples of the questions,
    the same resamples for every run (:func:`inactive_heads.analysis.curve_intervals`).

    Censoring, for both max-% statistics (``<stat>`` is ``max_pct_within`` or ``max_pct_agree``):
    ``<stat>_censored`` is True when the curve never reached its line in the tested range, so
    ``<stat>`` is a lower bound (the largest realized %); ``<stat>_uncrossed`` counts the
    resamples whose curve did not reach it; ``<stat>_low_censored`` / ``<stat>_high_censored``
    say that an interval end is itself a lower bound (False, and ``_uncrossed`` NaN, where the
    statistic is NaN). The rank is by normalized AUC only.
    """
    arrays, n = _record_arrays(results)
    has_baseline = BASELINE in arrays
    by_key: dict[str, list[tuple[float, str]]] = {}
    for run_id, rec in results.records.items():
        if rec.score and run_id in arrays:
            by_key.setdefault(rec.score, []).append((float(rec.realized_percent), run_id))
    by_key = {k: by_key[k] for k in results.score_keys if k in by_key}
    if not by_key:
        return pd.DataFrame(columns=COLUMNS)
    indices = bootstrap_indices(n, n_resamples, seed)
    accuracy = curve_intervals(
        {k: [(x, arrays[r]["correct"]) for x, r in runs] for k, runs in by_key.items()},
        arrays[BASELINE]["correct"] if has_baseline else 0.0, tolerance, indices=indices,
    ).set_index("score")
    if not has_baseline:
        accuracy[["max_pct_within", "max_pct_within_low", "max_pct_within_high", "max_pct_within_uncrossed"]] = math.nan
        accuracy[[c for c in CENSORING_COLUMNS if c.endswith("censored")]] = False
    with_agreement = {k: runs for k, runs in by_key.items() if all("agree" in arrays[r] for _, r in runs)}
    agreement = curve_intervals(
        {k: [(x, arrays[r]["agree"]) for x, r in runs] for k, runs in with_agreement.items()},
        100.0, AGREEMENT_TOLERANCE, indices=indices,
    ).set_index("score")
    rows = []
    for key, runs in by_key.items():
        acc = accuracy.loc[key]
        agree = agreement.loc[key] if key in agreement.index else None
        within = {c: acc[c] for c in ["max_pct_within", "max_pct_within_low", "max_pct_within_high",
                                       *CENSORING_COLUMNS]}
        agreed = {c.replace("max_pct_within", "max_pct_agree"): _missing(c) if agree is None else agree[c]
                  for c in within}
        rows.append({
            "score": key,
            "label": results.score_label(key),
            **within,
            "normalized_auc": acc["normalized_auc"],
            "auc_low": acc["auc_low"],
            "auc_high": acc["auc_high"],
            **agreed,
            "max_realized_pct": max(x for x, _ in runs),
            "points": len(runs),
        })
    frame = pd.DataFrame(rows).sort_values("normalized_auc", ascending=False, kind="stable")
    frame = frame.reset_index(drop=True)
    frame["rank"] = auc_ranks(dict(zip(frame["score"], frame["normalized_auc"]))).astype(int).to_numpy()
    return frame[COLUMNS]


MAX_PCT_STATS = ("max_pct_within", "max_pct_agree")
"""The two max-% statistics of the summary table, each with its censoring columns."""


def _plain(value: Any) -> Any:
    """A cell as JSON has it: numpy scalars as Python ones, NaN as None."""
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    return value


def summary_records(frame: pd.DataFrame, *, n_resamples: int = DEFAULT_RESAMPLES) -> list[dict[str, Any]]:
    """A :func:`summary_table` (or :func:`inactive_heads.analysis.curve_intervals`) frame as
    JSON-ready records, one per score, what ``inactive-heads report --json`` prints.

    Each max-% statistic (``max_pct_within``, ``max_pct_agree``) becomes ``{"value", "low",
    "high", "censored", "low_censored", "high_censored", "uncrossed", "resamples"}``: with
    ``"censored": true`` the value is a lower bound (the curve never reached its line; the
    largest realized %), an end flagged censored is a bound too, and ``uncrossed`` of the
    ``resamples`` (``n_resamples``, those the frame was computed with) did not reach the line.
    The normalized AUC becomes ``{"value", "low", "high"}``; other columns stay as they are.
    NaN (a statistic that cannot be computed) is ``null``.
    """
    grouped = {stat: [stat, f"{stat}_low", f"{stat}_high", *(c.replace("max_pct_within", stat) for c in CENSORING_COLUMNS)]
               for stat in MAX_PCT_STATS}
    grouped["normalized_auc"] = ["normalized_auc", "auc_low", "auc_high"]
    records = []
    for _, row in frame.iterrows():
        record: dict[str, Any] = {}
        for col in frame.columns:
            stat = next((s for s, cols in grouped.items() if col in cols), None)
            if stat is None:
                record[col] = _plain(row[col])
            elif col == stat:
                cols = [c for c in grouped[stat] if c in frame.columns]
                names = [c.replace(stat, "value", 1) if c == stat else c.removeprefix(f"{stat}_") for c in cols]
                names = [{"auc_low": "low", "auc_high": "high"}.get(n, n) for n in names]
                record[stat] = {n: _plain(row[c]) for n, c in zip(names, cols)}
                if stat != "normalized_auc":
                    record[stat]["resamples"] = int(n_resamples)
        records.append(record)
    return records


def _missing(column: str) -> float | bool:
    """A statistic's cell where it cannot be computed: NaN, and no censoring flag."""
    return False if column.endswith("censored") else math.nan


def runs_table(
    results: RunRecords,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per finished run, baseline first, with paired bootstrap intervals: ``accuracy``
    (%), ``difference`` from the baseline (points), ``agreement`` (% of questions whose chosen
    answer is the baseline's) and ``kl`` (mean KL(baseline ‖ run) over the answer choices, nats);
    each with ``_low``/``_high``. Difference, agreement and KL need the baseline run (and the
    last two its log-likelihoods); NaN otherwise."""
    arrays, n = _record_arrays(results)
    order = [r for r, _, _ in results.config.run_ids() if r in arrays]
    order += [r for r in arrays if r not in order]
    columns = ["run_id", "score", "label", "p", "realized_pct"] + [
        f"{m}{s}" for m in ("accuracy", "difference", "agreement", "kl") for s in ("", "_low", "_high")
    ]
    if not order:
        return pd.DataFrame(columns=columns)
    counts = bootstrap_counts(n, n_resamples, seed)
    base = arrays.get(BASELINE)
    rows = []
    for run_id in order:
        rec, a = results.records[run_id], arrays[run_id]
        stats = {"accuracy": a["correct"]}
        if base is not None:
            stats["difference"] = a["correct"] - base["correct"]
        if "agree" in a:
            stats["agreement"], stats["kl"] = a["agree"], a["kl"]
        row = {"run_id": run_id, "score": rec.score, "label": rec.label, "p": rec.p,
               "realized_pct": rec.realized_percent}
        means = counts @ np.stack(list(stats.values())).T / n
        for j, (name, values) in enumerate(stats.items()):
            ci = percentile_interval(values.mean(), means[:, j])
            row.update({name: ci.estimate, f"{name}_low": ci.low, f"{name}_high": ci.high})
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=columns)


def resolution_note(results: RunRecords, tolerance: Real = 1.0) -> str | None:
    """One line when the baseline's 95 % interval is wider than ``tolerance`` points: the sample
    cannot resolve that difference, and about how many questions would
    (:func:`inactive_heads.analysis.questions_to_resolve`)."""
    rec = results.records.get(BASELINE)
    if not rec or not rec.correct:
        return None
    ci = accuracy_interval(rec.correct)
    if ci.width <= float(tolerance):
        return None
    need = questions_to_resolve(ci.estimate, tolerance)
    return (
        f"with n = {len(rec.correct)} questions the baseline's 95% interval is {ci.width:.1f} points wide, "
        f"so this sample cannot resolve {tolerance_text(tolerance)} of accuracy; about {need:,} questions would "
        "(differences from the baseline are paired and resolve more: see each run's interval)."
    )


def missing_runs(results: RunRecords) -> list[str]:
    """Run ids of the sweep's plan that have no record yet."""
    return [run_id for run_id, _, _ in results.config.run_ids() if run_id not in results.records]
