"""Cell formatting shared by the plain-text summary and the HTML report: numbers, intervals, lower
bounds ("≥") and the note on a partial sweep."""

import math
import os

import pandas as pd

from ..analysis.bootstrap import DEFAULT_RESAMPLES, Real
from ..analysis.tables import BASELINE, missing_runs
from ..sweep.results import SweepResults


def _load(results: SweepResults | str | os.PathLike) -> SweepResults:
    return results if isinstance(results, SweepResults) else SweepResults.load(results)


def _n_questions(results: SweepResults) -> int | None:
    rec = results.records.get(BASELINE) or next(iter(results.records.values()), None)
    return rec.n if rec else None


def _partial_note(results: SweepResults, shown: int = 6) -> str | None:
    missing = missing_runs(results)
    if not missing:
        return None
    total = len(results.config.run_ids())
    listed = ", ".join(missing[:shown]) + (f" and {len(missing) - shown} more" if len(missing) > shown else "")
    note = f"partial sweep: {total - len(missing)} of {total} runs finished; missing {listed}."
    if BASELINE not in results.records:
        note += " No baseline run yet, so the max-% within tolerance is not available."
    return note


def _fmt(value: Real | None, digits: int = 2) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _range(low: Real, high: Real, digits: int = 2) -> str:
    return "—" if low is None or math.isnan(low) else f"{low:.{digits}f} to {high:.{digits}f}"


def _ci(value: Real, low: Real, high: Real, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"




def _bound(value: Real, censored: object, digits: int) -> str:
    """A number, or a lower bound ("≥ 29.1") when it is censored (a bool, numpy's too)."""
    return f"≥ {value:.{digits}f}" if censored else f"{value:.{digits}f}"


def _max_pct(r: pd.Series, stat: str, digits: int = 1) -> str:
    """A max-% statistic and its interval, every lower bound marked "≥" (text table)."""
    if r[stat] is None or math.isnan(r[stat]):
        return "—"
    return (f"{_bound(r[stat], r[f'{stat}_censored'], digits)} [{_bound(r[f'{stat}_low'], r[f'{stat}_low_censored'], digits)}, "
            f"{_bound(r[f'{stat}_high'], r[f'{stat}_high_censored'], digits)}]")


def _max_pct_range(r: pd.Series, stat: str, digits: int = 2) -> str:
    """The interval of a max-% statistic as "low to high", bounds marked "≥", with the resamples
    that did not reach the line when there are any (HTML report)."""
    if r[stat] is None or math.isnan(r[stat]):
        return "—"
    text = (f"{_bound(r[f'{stat}_low'], r[f'{stat}_low_censored'], digits)} to "
            f"{_bound(r[f'{stat}_high'], r[f'{stat}_high_censored'], digits)}")
    if r[f"{stat}_uncrossed"] > 0:
        text += f"; {int(r[f'{stat}_uncrossed'])} of {DEFAULT_RESAMPLES} resamples did not reach the line"
    return text
