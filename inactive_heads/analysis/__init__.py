"""Stage 6, analysis: accuracy curves against the realized fraction zeroed, max % within a
tolerance, normalized AUC ranking (:mod:`.curves`), the bootstrap over questions
(:mod:`.bootstrap`), paired comparisons with the baseline (:mod:`.paired`), flagged heads and
score distributions (:mod:`.heads`), and the sweep tables (:mod:`.tables`).

Every name below is available here, imported from its module on first use: evaluation needs only
:mod:`.bootstrap` (numpy), so importing it does not load pandas and scipy.
"""

import importlib

_NAMES = {
    "curves": (
        "Points",
        "max_fraction_within",
        "max_fraction_within_censored",
        "MaxWithin",
        "normalized_auc",
        "auc_ranks",
        "rank_by_auc",
        "max_fraction_table",
        "table2",
        "auc_table",
        "rank_table",
        "spearman_between_models",
        "top_k",
        "topk_iou",
    ),
    "heads": ("flagged_mask", "iou", "wasserstein", "wasserstein_matrix"),
    "bootstrap": (
        "DEFAULT_RESAMPLES",
        "DEFAULT_LEVEL",
        "Z_95",
        "Interval",
        "bootstrap_indices",
        "bootstrap_counts",
        "bootstrap_means",
        "percentile_interval",
        "accuracy_interval",
        "questions_to_resolve",
    ),
    "paired": (
        "difference_interval",
        "max_fraction_within_batch",
        "curve_intervals",
        "chosen_answers",
        "answer_agreement",
        "choice_kl",
    ),
    "tables": (
        "BASELINE",
        "RunRecords",
        "tolerance_text",
        "COLUMNS",
        "AGREEMENT_TOLERANCE",
        "summary_table",
        "summary_records",
        "runs_table",
        "resolution_note",
        "missing_runs",
    ),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
