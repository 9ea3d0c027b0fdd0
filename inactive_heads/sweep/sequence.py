"""The one sequence of a sweep, whichever executor runs its passes.

:func:`run_sequence` holds the folder's lock and does, in this order: check the folder against
the config (before any model loads), start the executor (it loads the model and tokenizes the
inputs; a task the model cannot be prompted with fails here, before ``sweep.json`` is written),
write ``sweep.json`` resolved by the model, the baseline pass (the baseline record and, when
thresholds are calibrated, the scores), the thresholds, the reused p = 0 records, the pending runs,
and, once, the tables. An :class:`Executor` only runs passes and writes their records: the local
one (:mod:`inactive_heads.sweep.executors.local`) or Ray actors (:mod:`inactive_heads.sweep.executors.ray`).

Re-running the same sequence skips finished runs, so an interrupted sweep loses nothing, and its
records equal an uninterrupted sweep's to the byte (timings aside) wherever it was killed. A
resume must compute in the same dtype on the same device type (``cpu``, ``cuda``, ``mps``); the
batch size and the device index may change (answers do not depend on them; a changed batch size
moves log-likelihoods within float rounding).
"""

from pathlib import Path
from typing import Protocol, runtime_checkable

from ..analysis.tables import BASELINE
from ..core.lock import FolderLock
from ..scoring.calibration import Thresholds
from .config import SweepConfig
from .folder import (
    SCORES_FILE,
    check_folder,
    find_scores_file,
    pending_runs,
    prepare_folder,
    record_path,
    write_reused_runs,
    write_thresholds,
)
from .results import SweepResults


@runtime_checkable
class Executor(Protocol):
    """What runs a sweep's passes (the local executor, or Ray actors), for :func:`run_sequence`."""

    def start(self) -> SweepConfig:
        """Load the model and plan the inputs; return the config resolved by that model
        (:meth:`SweepConfig.resolved`)."""

    def baseline(self, scores: bool, record: bool):
        """The unablated pass: with ``record``, write the baseline record; with ``scores``, return
        the HeadScores for calibration (else None)."""

    def runs(self, todo: list[tuple[str, str, float | None]], thresholds: dict[str, Thresholds]) -> None:
        """Evaluate the (run id, score key, p) runs in ``todo``, writing each run's record (p None: one of
        ``config.ablations``, its key its run id)."""

    def close(self) -> None:
        """Release what :meth:`start` holds (called also when the sequence fails)."""


def run_sequence(config: SweepConfig, out: Path, executor: Executor) -> SweepResults:
    """Run (or resume) the sweep ``config`` into ``out`` with ``executor``; returns its results.
    ``config`` is validated (:meth:`SweepConfig.validate`)."""
    with FolderLock(out):
        check_folder(config, out)  # before the model loads; dtype and device once it has
        try:
            prepare_folder(executor.start(), out)
            head_scores = baseline_scores(config, out, executor)
            thresholds = write_thresholds(config, out, head_scores)
            write_reused_runs(config, out, thresholds)
            executor.runs(pending_runs(config, out), thresholds)
        finally:
            executor.close()
        results = SweepResults.load(out)
        results.write_tables()
    return results


def baseline_scores(config: SweepConfig, out: Path, executor: Executor):
    """Run the baseline pass if its record or the calibration scores are missing; returns the
    scores (None unless thresholds are calibrated), saved as ``scores.safetensors``."""
    from ..scoring.recording import HeadScores

    scores_file = find_scores_file(out)
    head_scores = HeadScores.load(scores_file) if config.records_scores and scores_file else None
    need_scores = config.records_scores and head_scores is None
    need_record = not record_path(out, BASELINE).is_file()
    if need_scores or need_record:
        recorded = executor.baseline(need_scores, need_record)
        if need_scores:
            head_scores = recorded
            head_scores.save(out / SCORES_FILE)
    return head_scores
