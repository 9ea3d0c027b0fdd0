"""The read side of a sweep: :class:`SweepResults`, a results folder read back for analysis,
tables and plots.

:meth:`SweepResults.load` is the one loader; :func:`sweep_results` is the same call as a
function, and :func:`load_results` its records as a DataFrame. Reading takes the folder's stored
options as plain data (:meth:`SweepConfig.stored`): it imports no user module and checks no name
against the registries, so a folder opens on a machine without the score modules that produced it.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.tables import BASELINE
from ..core.checks import check_path
from ..core.errors import MissingFileError, UserError
from ..scoring.calibration import Thresholds
from ..scoring.scores import STATIC_SUFFIX, get_score, is_registered, score_label
from .config import SweepConfig
from .folder import SCORES_FILE, find_scores_file, read_records, read_score_info, read_sweep_json, read_thresholds
from .record import RunRecord, ScoreInfo


@dataclass
class SweepResults:
    """A finished (or partial) sweep read back from its folder, ready for analysis and plots."""

    path: Path
    config: SweepConfig
    thresholds: dict[str, Thresholds]
    records: dict[str, RunRecord]
    score_info: dict[str, ScoreInfo] = field(default_factory=dict)
    """What ``sweep.json`` says about the sweep's scores (empty for folders of format 1 and 2)."""

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SweepResults":
        """Read a results folder (the one loader: :func:`sweep_results` and :func:`load_results` call it)."""
        path = check_path(path, "path")
        if not (path / "sweep.json").is_file():
            raise MissingFileError(f"'{path}' is not a sweep results folder (no sweep.json); run a sweep first")
        return cls(path, SweepConfig.stored(read_sweep_json(path)), read_thresholds(path), read_records(path),
                   read_score_info(path))

    @property
    def baseline_percent(self) -> float:
        """Accuracy (%) of the nothing-zeroed run."""
        if BASELINE not in self.records:
            raise UserError(f"the sweep in '{self.path}' has no baseline run yet; resume it")
        return self.records[BASELINE].accuracy_percent

    def score_label(self, key: str) -> str:
        """The label of score ``key`` (or of a static curve ``"<key>@static"``, or of one of the
        sweep's ablations by its run id) as the folder says it: ``sweep.json``'s score info; in
        folders of formats 1 and 2, the registry's, else the label its records carry, else the key."""
        base = key.removesuffix(STATIC_SUFFIX)
        if base in self.score_info:
            return self.score_info[base].label + (", static" if base != key else "")
        if is_registered(base):
            return score_label(key)
        labels = [rec.label for rec in self.records.values() if rec.score == key and rec.label]
        return labels[0] if labels else key

    def score_direction(self, key: str) -> str:
        """The direction of score ``key`` ("below" or "above") as the folder says it:
        ``sweep.json``'s score info, else ``thresholds.json``, else the registry's; a score that
        none of them knows is a one-line error."""
        if key in self.score_info:
            return self.score_info[key].direction
        if key in self.thresholds:
            return self.thresholds[key].direction
        if is_registered(key):
            return get_score(key).direction
        raise UserError(f"the sweep in '{self.path}' does not say whether score '{key}' flags heads below or "
                        "above τ (a folder of an older format), and no module here registers it: import "
                        "the module that registers it")

    @property
    def score_keys(self) -> list[str]:
        """The keys of the score curves (runs at some p), in the config's order; the sweep's
        ``ablations`` (one run each, no p) are :attr:`ablation_keys`, never a curve."""
        keys = []
        for rec in self.records.values():
            if rec.curve_key and rec.curve_key not in keys:
                keys.append(rec.curve_key)
        order = [k for key in self.config.scores for k in (key, key + STATIC_SUFFIX)] + ["random"]
        return sorted(keys, key=lambda k: order.index(k) if k in order else len(order))

    @property
    def ablation_keys(self) -> list[str]:
        """The run ids of the finished runs of the sweep's ``ablations`` (one point each), in the config's order."""
        keys = [rid for rid, rec in self.records.items() if rec.score and rec.p is None]
        order = list(self.config.ablation_runs()) if self.config.ablations else []
        return sorted(keys, key=lambda k: order.index(k) if k in order else len(order))

    def curves(self, metric: str = "accuracy_percent") -> dict[str, list[tuple[float, float]]]:
        """Per score: (realized % zeroed, metric) points sorted by realized %."""
        out: dict[str, list[tuple[float, float]]] = {}
        for rec in self.records.values():
            if rec.curve_key:
                out.setdefault(rec.curve_key, []).append((rec.realized_percent, getattr(rec, metric)))
        return {k: sorted(out[k]) for k in self.score_keys}

    @property
    def is_complete(self) -> bool:
        return all(run_id in self.records for run_id, _, _ in self.config.run_ids())

    @property
    def scores_path(self) -> Path | None:
        """The HeadScores file recorded for calibration, or None (official thresholds, or not yet)."""
        return find_scores_file(self.path)

    def head_scores(self):
        from ..scoring.recording import HeadScores

        if self.scores_path is None:
            raise MissingFileError(f"'{self.path}' holds no recorded scores ({SCORES_FILE}); "
                                    "they exist once the baseline pass of a calibrated sweep has run")
        return HeadScores.load(self.scores_path)

    def to_dataframe(self, level: str = "runs"):
        """The records as a pandas DataFrame: ``level="runs"`` one row per run (model, task, score,
        label, p, threshold, realized %, accuracy, n, seconds, dtype, device, backend);
        ``level="questions"`` one row per run x question (subject, doc id, gold, correct,
        log-likelihoods, acc_norm correctness where the task has it)."""
        import pandas as pd

        if level not in ("runs", "questions"):
            raise UserError(f"level must be 'runs' or 'questions', got {level!r}")
        order = [rid for rid, _, _ in self.config.run_ids() if rid in self.records]
        order += [rid for rid in self.records if rid not in order]
        if level == "runs":
            rows = [{"run_id": rid, **{c: getattr(self.records[rid], c) for c in RUN_COLUMNS}} for rid in order]
            frame = pd.DataFrame(rows, columns=["run_id", *RUN_COLUMNS])
            frame["reused_from"] = [self.records[rid].reused_from for rid in order]
            return frame
        rows = []
        for rid in order:
            rec = self.records[rid]
            n = rec.n
            norm = rec.correct_norm or [None] * n
            for i in range(n):
                rows.append({
                    "run_id": rid, "model": rec.model if rec.model is not None else self.config.model,
                    "task": rec.task, "score": rec.score, "p": rec.p, "question": i,
                    "subject": (rec.subjects or [None] * n)[i],
                    "doc_id": (rec.doc_ids or [None] * n)[i],
                    "gold": (rec.gold or [None] * n)[i],
                    "correct": rec.correct[i],
                    "correct_norm": norm[i],
                    "loglikelihoods": (rec.loglikelihoods or [None] * n)[i],
                })
        return pd.DataFrame(rows, columns=QUESTION_COLUMNS)

    def write_tables(self) -> tuple[Path, Path]:
        """Write ``runs.parquet`` and ``questions.parquet`` (atomically) into the sweep folder."""
        from ..core.io import atomic_path

        paths = []
        for level in ("runs", "questions"):
            path = self.path / f"{level}.parquet"
            with atomic_path(path) as tmp:
                self.to_dataframe(level).to_parquet(tmp, index=False)
            paths.append(path)
        return paths[0], paths[1]

    def table(self, tolerance: int | float = 1.0):
        """The summary table, one row per score with 95 % intervals:
        :func:`inactive_heads.analysis.tables.summary_table` (the one place it is computed)."""
        from ..analysis.tables import summary_table

        return summary_table(self, tolerance)


RUN_COLUMNS = ("model", "task", "score", "label", "p", "threshold", "realized_percent", "accuracy_percent",
               "acc_norm", "n", "seconds", "dtype", "device", "backend")
QUESTION_COLUMNS = ("run_id", "model", "task", "score", "p", "question", "subject", "doc_id", "gold", "correct",
                    "correct_norm", "loglikelihoods")


def load_results(path: str | os.PathLike, level: str = "runs"):
    """A sweep folder's results as a pandas DataFrame (``level="runs"`` or ``"questions"``).

    >>> ih.load_results("results/").sort_values("accuracy_percent")    # doctest: +SKIP
    """
    return SweepResults.load(path).to_dataframe(level)


def sweep_results(path: str | os.PathLike) -> SweepResults:
    """Read a results folder written by :func:`run_sweep` (or ``inactive-heads sweep``)."""
    return SweepResults.load(path)
