"""``run_sweep``: validate the config, pick an executor, run the one sweep sequence.

The config lives in :mod:`inactive_heads.sweep.config`, the folder format in
:mod:`inactive_heads.sweep.folder`, the sequence (lock, folder, baseline, thresholds, runs,
tables) in :mod:`inactive_heads.sweep.sequence`, the executors in
:mod:`inactive_heads.sweep.executors` (Ray is imported only when ``executor="ray"``), the read
side in :mod:`inactive_heads.sweep.results`.
"""

from __future__ import annotations

import os

from ..core.checks import check_path
from ..core.errors import UserError, WrongTypeError
from .config import SweepConfig
from .executors.local import LocalExecutor
from .results import SweepResults
from .sequence import run_sequence

EXECUTORS = ("local", "ray")


def run_sweep(
    config: SweepConfig,
    out_dir: str | os.PathLike,
    *,
    model=None,
    progress: bool = True,
    executor: str = "local",
    address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float | None = None,
    threads_per_worker: int | None = None,
    shards: int | None = None,
) -> SweepResults:
    """Run (or resume) a sweep into ``out_dir``; returns its :class:`SweepResults`.

    ``executor="local"``: the model is loaded once (or pass ``model``, which must be the model
    ``config.model`` names) and the task tokenized once for all runs. ``executor="ray"``: Ray
    actors (``workers``, each with ``gpus_per_worker`` GPUs and ``threads_per_worker`` CPU
    threads) run shards of the inputs; ``address`` joins an existing Ray cluster (``"auto"`` or
    ``"ray://host:port"``), otherwise Ray starts on this machine. Same records either way.
    """
    if not isinstance(config, SweepConfig):
        raise WrongTypeError(f"config must be a SweepConfig, got {type(config).__name__}")
    out = check_path(out_dir, "out_dir")
    config.validate()  # the write side's one check: imports config.imports, checks every option
    if executor not in EXECUTORS:
        raise UserError(f"unknown executor '{executor}'; use one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        if model is not None:
            raise UserError("model= applies to the local executor only; Ray workers load config.model")
        if config.save_flags:
            raise UserError("save_flags (each input's zeroed heads) runs on the local executor only; use "
                            "executor='local' (--executor local)")
        if config.static_rule is not None:
            raise UserError("static runs (static_rule) run on the local executor only; use executor='local' "
                            "(--executor local)")
        from .executors.ray import RayExecutor

        return run_sequence(config, out, RayExecutor(
            config, out, address=address, workers=workers, gpus_per_worker=gpus_per_worker,
            threads_per_worker=threads_per_worker, shards=shards, progress=progress))
    if address is not None or workers is not None or gpus_per_worker is not None or shards is not None:
        raise UserError("address, workers, gpus_per_worker and shards apply to executor='ray' only")
    return run_sequence(config, out, LocalExecutor(config, out, model=model, progress=progress))


__all__ = ["EXECUTORS", "run_sweep"]
