"""The grid in one command: models x tasks, one sweep folder each, and the cross-model table.

A grid file (TOML)::

    out = "grid-results"          # one folder per (model, task) below it: <model>__<task>
    models = ["smollm2-135m", "gemma-3-270m"]
    tasks = ["mmlu"]
    executor = "local"            # or "ray"

    [sweep]                       # any SweepConfig option except model and task; decision and
                                  # max_gen_toks reach the generation tasks (gsm8k) only
    subjects = ["anatomy"]
    limit = 10
    scores = ["ahon_ln", "awft"]
    quantiles = [0.1, 0.3]

    [ray]                         # run_sweep's Ray options (executor = "ray")
    workers = 2

:func:`compare_table` puts finished sweep folders side by side in the paper's Table 2 layout:
baseline accuracy (with its 95 % bootstrap interval), AWFT's max % zeroed within the tolerance,
the best other score and its max %, and each score's rank by normalized AUC. A curve that never
reached its line in the tested range gives its lower bound there, flagged censored (shown "≥");
the paper's rule (0 for such a curve) stays beside it in the ``*_paper_rule`` columns.
"""

from __future__ import annotations

import html
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.bootstrap import accuracy_interval
from ..analysis.curves import auc_table, rank_table, table2
from ..analysis.tables import BASELINE, NOT_REACHED
from ..core.io import write_text_atomic
from .config import GENERATION_OPTIONS, SweepConfig
from .results import SweepResults
from .run import EXECUTORS, run_sweep
from ..core.errors import MissingFileError, UserError

RAY_OPTIONS = ("address", "workers", "gpus_per_worker", "threads_per_worker")


@dataclass
class GridConfig:
    """Models x tasks with shared sweep options; round-trips to the TOML/JSON layout above."""

    models: list[str]
    tasks: list[str] = field(default_factory=lambda: ["mmlu"])
    out: str = "grid-results"
    executor: str = "local"
    sweep: dict[str, Any] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.models or not self.tasks:
            raise UserError("a grid needs at least one model and one task (keys 'models' and 'tasks')")
        if self.executor not in EXECUTORS:
            raise UserError(f"unknown executor '{self.executor}'; use one of {', '.join(EXECUTORS)}")
        bad = sorted(set(self.sweep) & {"model", "task"})
        if bad:
            raise UserError(f"set {bad[0]} in the grid's '{bad[0]}s' list, not in [sweep]")
        unknown = sorted(set(self.ray) - set(RAY_OPTIONS))
        if unknown:
            raise UserError(f"unknown [ray] option '{unknown[0]}'; known: {', '.join(RAY_OPTIONS)}")
        if self.ray and self.executor != "ray":
            raise UserError("a [ray] section needs executor = \"ray\"")
        for model, task in self.cells():
            self.sweep_config(model, task)  # every cell's options are checked before anything runs

    @classmethod
    def load(cls, path: str | os.PathLike) -> "GridConfig":
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(f"no grid file at '{path}'; write one (see 'inactive-heads grid --help')")
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"'{path}' is not valid TOML: {e}") from None
        known = {"models", "tasks", "out", "executor", "sweep", "ray"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown grid key '{unknown[0]}' in '{path}'; known: {', '.join(sorted(known))}")
        if "models" not in data:
            raise UserError(f"'{path}' has no 'models' list; a grid names the models to sweep (and tasks, out)")
        if "out" in data and not isinstance(data["out"], str):
            raise UserError(f"out in '{path}' must be a folder path (a string), got {data['out']!r}")
        if "out" in data and not Path(data["out"]).is_absolute():
            data["out"] = str(path.parent / data["out"])
        return cls(**data)

    def cells(self) -> list[tuple[str, str]]:
        return [(m, t) for m in self.models for t in self.tasks]

    def sweep_config(self, model: str, task: str) -> SweepConfig:
        """The cell's SweepConfig, validated; the generation options (``decision``, ``max_gen_toks``) go
        to generation tasks (gsm8k) only, so one grid can mix them with multiple-choice tasks."""
        from ..evaluation.tasks import task_kind

        options = dict(self.sweep)
        if task_kind(task) != "generation":
            for name in GENERATION_OPTIONS:
                options.pop(name, None)
        return SweepConfig(model=model, task=task, **options).validate()

    def folder(self, model: str, task: str) -> Path:
        safe = model.replace("/", "_").replace(":", "_")
        return Path(self.out) / f"{safe}__{task}"


def run_grid(grid: GridConfig, *, progress: bool = True, tolerance: float = 1.0) -> pd.DataFrame:
    """Run (or resume) every (model, task) sweep, then write the cross-model table into
    ``grid.out`` (``compare.md``, ``compare.csv``, ``compare.html``); returns it."""
    folders = []
    for model, task in grid.cells():
        folder = grid.folder(model, task)
        options = {k: v for k, v in grid.ray.items() if v is not None}
        run_sweep(grid.sweep_config(model, task), folder, executor=grid.executor, progress=progress, **options)
        folders.append(folder)
    table = compare_table(folders, tolerance=tolerance)
    write_compare(table, grid.out, tolerance=tolerance)
    return table


def compare_table(folders: Sequence[str | os.PathLike], *, tolerance: float = 1.0, sink_key: str = "awft") -> pd.DataFrame:
    """One row per sweep folder: model, task, n, baseline % [95 % CI], the sink score's and the
    best other score's max % zeroed within ``tolerance`` points, and every score's AUC rank.

    ``<sink>_max_pct`` and ``best_other_max_pct`` read a curve that never reached its line in the
    tested range as its lower bound (the largest realized %), flagged in ``<sink>_censored`` and
    ``best_other_censored``; the best other score is the largest value-or-bound (ties: the first
    in the sweep's score order, as :func:`inactive_heads.analysis.table2`). The paper's rule (0
    for such a curve; Table 2 as published) follows in ``<sink>_max_pct_paper_rule``,
    ``best_other_paper_rule`` and ``best_other_max_pct_paper_rule``."""
    results = [SweepResults.load(f) for f in folders]
    names = [_cell_name(r) for r in results]
    if len(set(names)) != len(names):
        raise UserError(f"two folders hold the same model and task ({names}); compare distinct sweeps")
    curves = {name: r.curves() for name, r in zip(names, results)}
    baselines = {name: r.baseline_percent for name, r in zip(names, results)}
    for name, c in curves.items():
        if sink_key not in c:
            raise UserError(f"the sweep of {name} has no '{sink_key}' runs; the table compares against it")
    main = table2(curves, baselines, tolerance=tolerance, sink_key=sink_key, if_never_crosses="max_x")
    paper = table2(curves, baselines, tolerance=tolerance, sink_key=sink_key).set_index("model")
    ranks = rank_table(auc_table(curves)).drop(index="mean_rank", errors="ignore")
    rows = []
    for name, r in zip(names, results):
        base = r.records[BASELINE]
        ci = accuracy_interval(base.correct)
        row = main.set_index("model").loc[name]
        rows.append({
            "model": r.config.model, "task": r.config.task, "n": base.n,
            "baseline_pct": round(ci.estimate, 2), "baseline_low": round(ci.low, 2), "baseline_high": round(ci.high, 2),
            f"{sink_key}_max_pct": row[f"{sink_key}_max_pct"], f"{sink_key}_censored": bool(row[f"{sink_key}_censored"]),
            "best_other": row["best_other_key"], "best_other_max_pct": row["best_other_max_pct"],
            "best_other_censored": bool(row["best_other_censored"]),
            f"{sink_key}_max_pct_paper_rule": paper.loc[name, f"{sink_key}_max_pct"],
            "best_other_paper_rule": paper.loc[name, "best_other_key"],
            "best_other_max_pct_paper_rule": paper.loc[name, "best_other_max_pct"],
            **{f"rank_{k}": ranks.loc[name, k] for k in ranks.columns},
        })
    return pd.DataFrame(rows)


def _cell_name(results: SweepResults) -> str:
    return f"{results.config.model} / {results.config.task}"


def write_compare(table: pd.DataFrame, out: str | os.PathLike, *, tolerance: float = 1.0) -> list[Path]:
    """``compare.md``, ``compare.csv`` and a self-contained ``compare.html`` in ``out``."""
    out = Path(out)
    caption = (f"Max % of heads zeroed with accuracy within {tolerance:g} point(s) of the baseline; ranks by "
               "normalized AUC (1 = best). Baseline: accuracy % [95 % bootstrap interval over questions]. "
               f"≥ X: the curve never reached its line up to X, the largest % zeroed tested, so X is a lower "
               f"bound ({NOT_REACHED}); the best other score is the largest value or bound. *_paper_rule: the "
               "paper's rule, which counts such a curve 0 (Table 2 as published).")
    shown = _shown(table)
    paths = [
        write_text_atomic(out / "compare.md", f"{caption}\n\n{_markdown(table)}\n"),
        write_text_atomic(out / "compare.csv", table.to_csv(index=False)),
        write_text_atomic(out / "compare.html", (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>inactive-heads: models "
            "compared</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>\n</head>\n<body>\n"
            f"<h1>Models compared</h1>\n<p>{html.escape(caption)}</p>\n"
            f"{shown.to_html(index=False, na_rep='-')}\n</body>\n</html>\n")),
    ]
    return paths


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as compare.md and compare.html show it: numbers as text, a censored max-% as
    "≥ bound" in place of its ``_censored`` column (compare.csv keeps both)."""
    flags = [c for c in table.columns if c.endswith("_censored")]
    shown = pd.DataFrame(index=table.index)
    for col in table.columns:
        if col in flags:
            continue
        flag = f"{col.removesuffix('_max_pct')}_censored" if col.endswith("_max_pct") else None
        shown[col] = [
            _cell(col, v, bool(table.at[i, flag]) if flag in flags else False) for i, v in table[col].items()
        ]
    return shown


def _cell(col: str, v: Any, censored: bool) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        text = f"{v:g}" if col.startswith("rank_") else f"{v:.2f}"
        return f"≥ {text}" if censored else text
    return str(v)


def _markdown(table: pd.DataFrame) -> str:
    shown = _shown(table)
    cols = list(shown.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join(lines)


__all__ = ["GridConfig", "compare_table", "run_grid", "write_compare"]
