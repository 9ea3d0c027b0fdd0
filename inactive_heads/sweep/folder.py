"""A sweep's results folder: its paths, and the format of what it holds.

::

    sweep.json          the SweepConfig that produced it, with the dtype and the device type the
                        model ran in (re-running checks that the sweep's identity matches), and
                        what each of its scores is (``score_info``: label, direction, reads)
    scores.safetensors  HeadScores recorded in the baseline pass, on the evaluation inputs themselves
    thresholds.json     one Thresholds per score (quantiles of the pooled CDF, or the paper's preset)
    runs/<id>.json      one record per finished run, written atomically the moment it finishes
    runs/<id>.flags.safetensors
                        with ``save_flags``: each input's zeroed heads in that run, [input, layer,
                        head] booleans (written just before its record)
    static_scores.safetensors, static_heads.json
                        with static runs: HeadScores of the calibration questions and the head
                        set of each static run
    runs.parquet        one row per run (written when the sweep command ends)
    questions.parquet   one row per run x question
    .lock               while a driver works on the folder: its host and pid
                        (:class:`~inactive_heads.core.lock.FolderLock`)
    shards/             Ray executor only: the layout and each finished (run, shard)

``sweep.json`` and every record carry ``"format_version"`` (:data:`RESULTS_FORMAT`, the formats in
:mod:`inactive_heads.sweep.record`); a folder without one was written before versions were kept
(format 1) and reads the same. Records are :class:`~inactive_heads.sweep.record.RunRecord` objects,
written and read only through it. The readers here (:func:`read_sweep_json`,
:func:`read_score_info`, :func:`read_thresholds`, :func:`read_records`) take the stored options as
plain data: they import no user module and check no name against the registries. A folder of a
newer format is a one-line error naming the version it needs.

A p = 0 run whose threshold was calibrated on these inputs (or Random at p = 0) zeroes nothing by
construction; its record is the baseline's, marked ``"reused_from": "baseline"``
(:func:`write_reused_runs`).
"""

import json
from pathlib import Path
from typing import Any

from ..analysis.tables import BASELINE
from ..core.errors import UserError
from ..core.io import write_json_atomic
from ..core.resume import check_same_setup, differing_keys
from ..scoring.calibration import Thresholds
from .config import SweepConfig, ablation_for, device_type, run_id, run_label, thresholds_for
from .record import RESULTS_FORMAT, VOLATILE_FIELDS, RunRecord, ScoreInfo, check_format, now  # noqa: F401

SCORES_FILE = "scores.safetensors"
LEGACY_SCORES_FILE = "scores.pt"
STATIC_SCORES_FILE = "static_scores.safetensors"
STATIC_HEADS_FILE = "static_heads.json"
FLAGS_SUFFIX = ".flags.safetensors"
SCORE_INFO = "score_info"
"""The key of ``sweep.json`` (format 3) that describes the sweep's scores (:class:`ScoreInfo` each)."""


def read_json_file(path: Path, *, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A results folder's JSON object at ``path`` (with ``keys``), else one line naming the file: a
    truncated or foreign file, or text that is not UTF-8."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"'{path}' is not a results file of inactive-heads (not valid JSON: {e}); the folder is "
                        "damaged or another tool's: rerun the sweep into a new folder") from None
    missing = [k for k in keys if k not in d] if isinstance(d, dict) else list(keys)
    if not isinstance(d, dict) or missing:
        raise UserError(f"'{path}' is not a results file of inactive-heads (a JSON {type(d).__name__}"
                        f"{' without ' + ', '.join(missing) if isinstance(d, dict) else ''}); the folder is "
                        "damaged or another tool's: rerun the sweep into a new folder")
    return d


def read_sweep_json(folder: Path) -> dict[str, Any]:
    """``folder/sweep.json``'s options (without ``format_version`` and ``score_info``), after
    checking that this version of the toolkit reads that format."""
    d = read_json_file(folder / "sweep.json")
    check_format(d.pop("format_version", 1), folder / "sweep.json")
    d.pop(SCORE_INFO, None)
    return d


def read_score_info(folder: Path) -> dict[str, ScoreInfo]:
    """What ``folder/sweep.json`` says about the sweep's scores, by key; empty for a folder of
    format 1 or 2 (written before folders described their scores)."""
    path = folder / "sweep.json"
    d = read_json_file(path)
    check_format(d.get("format_version", 1), path)
    info = d.get(SCORE_INFO) or {}
    if not isinstance(info, dict):
        raise UserError(f"'{path}' has a malformed score_info ({type(info).__name__}, not an object); the "
                        "folder is damaged: rerun the sweep into a new folder")
    return {key: ScoreInfo.from_json(v, path) for key, v in info.items()}


def score_info_of(config: SweepConfig) -> dict[str, ScoreInfo]:
    """The registry's info of each of the config's scores (and Random), as ``sweep.json`` keeps it."""
    keys = list(config.scores) + (["random"] if config.include_random else [])
    return {key: ScoreInfo.registered(key) for key in keys}


def stored_config(out: Path) -> SweepConfig | None:
    """The sweep ``out`` holds (None for a new folder), its dtype and device type resolved.

    ``sweep.json`` files of earlier versions may say ``dtype="auto"`` or ``device=None``; what
    ran is then read from the run records. Records that disagree (a sweep resumed in another
    precision) cannot be mixed: a one-line error.
    """
    path = out / "sweep.json"
    if not path.is_file():
        return None
    stored = SweepConfig.from_dict(read_sweep_json(out)).validate()  # the write side: it resumes this sweep
    if stored.dtype != "auto" and stored.device is not None:
        return stored
    ran = sorted({(rec.dtype, device_type(rec.device)) for rec in _record_files(out).values() if rec.dtype and rec.device})
    if len(ran) > 1:
        raise UserError(f"'{out}' holds runs computed in {' and in '.join(f'{d} on {t}' for d, t in ran)} (its "
                        "sweep.json, from an earlier version, left the dtype unresolved); their numbers do not "
                        "mix: start a new folder")
    if not ran:
        return stored  # nothing ran yet: the dtype is settled by the first model that runs
    dtype, device = ran[0]
    return stored.resolved(dtype=dtype if stored.dtype == "auto" else stored.dtype,
                           device=device if stored.device is None else stored.device)


def check_folder(config: SweepConfig, out: Path, *, fix: str = "use another --out folder or delete it") -> None:
    """Check that ``out`` holds this sweep, or nothing yet. A dtype of ``"auto"`` or a device of
    None, on either side, is compared once the model has settled it (:func:`prepare_folder`).
    ``fix``: what the error for a folder of another sweep tells the user to do."""
    stored = stored_config(out)
    if stored is None:
        return
    have, want = stored.identity(), config.identity()
    for key, unresolved in (("dtype", "auto"), ("device", None)):
        if unresolved in (have[key], want[key]):
            del have[key], want[key]
    check_same_setup(out, have, want, what="sweep", fix=fix, ignore=("dtype", "device"))
    differing = differing_keys(have, want)
    if differing:
        here = config.dtype + ("" if config.device is None else f" on {device_type(config.device)}")
        raise UserError(f"'{out}' was computed in {stored.dtype} on {stored.device}, this run would compute in "
                        f"{here}; resume with --dtype {stored.dtype} "
                        f"--device {stored.device} (dtype=, device=), or use another --out folder")


def prepare_folder(config: SweepConfig, out: Path) -> None:
    """Check that ``out`` holds this sweep (or nothing yet) and write ``sweep.json``. ``config``
    is resolved (:meth:`SweepConfig.resolved`): its dtype and device type are the model's."""
    if config.dtype == "auto" or config.device is None:
        raise ValueError("prepare_folder needs a resolved config (SweepConfig.resolved)")
    config = config.resolved(dtype=config.dtype, device=config.device)  # the device's type, not its index
    check_folder(config, out)
    info = {key: i.to_json() for key, i in score_info_of(config).items()}
    write_json_atomic(out / "sweep.json", {"format_version": RESULTS_FORMAT, **config.to_dict(), SCORE_INFO: info})



def find_scores_file(out: Path) -> Path | None:
    """The folder's HeadScores file (``scores.safetensors``, or ``scores.pt`` of older folders)."""
    for name in (SCORES_FILE, LEGACY_SCORES_FILE):
        if (out / name).is_file():
            return out / name
    return None


def write_thresholds(config: SweepConfig, out: Path, head_scores) -> dict[str, Thresholds]:
    keys = list(config.scores) + (["random"] if config.include_random else [])
    thresholds = {key: thresholds_for(config, key, head_scores) for key in keys}
    write_json_atomic(out / "thresholds.json", {k: t.to_dict() for k, t in thresholds.items()})
    return thresholds



def record_path(out: Path, rid: str) -> Path:
    return out / "runs" / f"{rid}.json"


def flags_path(out: Path, rid: str) -> Path:
    return out / "runs" / f"{rid}{FLAGS_SUFFIX}"


def write_flags(out: Path, rid: str, flags) -> Path:
    """Write a run's zeroed heads per input (``[input, layer, head]`` booleans, the plan's input
    order) atomically to ``runs/<id>.flags.safetensors``; before the run's record, so a finished
    run of a ``save_flags`` sweep always has them."""
    import torch
    from safetensors.torch import save_file

    from ..core.io import atomic_path

    path = flags_path(out, rid)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({"flags": flags.detach().to("cpu", torch.bool).contiguous()}, str(tmp))
    return path


def read_flags(out: Path, rid: str):
    """The zeroed heads per input of run ``rid`` (:func:`write_flags`), a bool tensor; a one-line
    error when the sweep did not keep them."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = flags_path(out, rid)
    if not path.is_file():
        raise UserError(f"'{path}' is missing: the sweep in {out} did not keep each input's zeroed heads "
                        "(save_flags); run it again with save_flags=True into a new folder")
    try:
        return load_file(str(path))["flags"]
    except (SafetensorError, KeyError, OSError) as err:
        raise UserError(f"'{path}' is not a flags file of inactive-heads ({err}); the folder is damaged: "
                        "rerun the sweep into a new folder") from None


def write_record(out: Path, record: RunRecord) -> Path:
    """Write a run's record atomically to ``runs/<id>.json``."""
    return write_json_atomic(record_path(out, record.run_id), record.to_json())


def make_record(config: SweepConfig, rid: str, key: str | None, q: float | None, tau: float | None,
                result, plan, model, heads=None) -> RunRecord:
    """The run record: what ran, its accuracy and realized zeroing, and every question's outcome.
    A static run (``heads``) also names its head set and the rule and questions that chose it; an
    ablated run, what an oracle skipping its zeroed heads would save. A generation task's record
    (``plan`` = its requests) keeps each question's generation and extracted answers instead of
    log-likelihoods; its ``accuracy`` is the strict exact match."""
    import torch

    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    spec = ablation_for(config, key, tau, heads)
    info = model_info(model)
    outcomes = _generation_outcomes(result, plan) if config.is_generation else {
        "acc_norm": result.acc_norm,
        "realized_fraction": result.realized_fraction,
        "realized_percent": 100 * result.realized_fraction,
        "realized_fraction_per_layer": result.realized_fraction_per_layer,
        "n": result.n,
        "n_forward_sequences": result.n_forward_sequences,
        "correct": result.correct,
        "correct_norm": result.correct_norm,
        "loglikelihoods": result.loglikelihoods,
        "gold": [req.gold for req in plan.requests],
        "doc_ids": [req.doc_id for req in plan.requests],
        "subjects": [req.subject for req in plan.requests],
        "per_subject": result.per_subject,
    }
    static = {} if heads is None else {
        "static_rule": heads.rule, "static_calibration": config.static_calibration,
        "static_heads": [list(h) for h in heads], "static_n_sequences": heads.n_sequences,
    }
    oracle = {}
    if getattr(result, "flagged", None) is not None:
        from ..pruning.accountant import oracle_summary

        oracle["oracle_savings"] = oracle_summary(model, result.flagged, [len(x) for x in plan.inputs])
    return RunRecord(
        format_version=RESULTS_FORMAT,
        run_id=rid,
        model=config.model,
        task=result.task,
        score=key,
        label=run_label(config, key),
        p=q,
        threshold=tau,
        accuracy=result.accuracy,
        accuracy_percent=100 * result.accuracy,
        **outcomes,
        dtype=info.dtype,
        device=str(model_device(model)),
        backend=info.backend,
        batch_size=config.batch_size,
        torch_threads=torch.get_num_threads(),  # fp32 sums are ordered by the thread count
        seconds=result.seconds,
        ablation=spec.to_dict() if spec else None,
        **static,
        **oracle,
        finished_at=now(),
    )


def _generation_outcomes(result, requests) -> dict[str, Any]:
    """A generation run's outcomes (a ``GenerationResult``), in the fields every record has."""
    return {
        "acc_norm": None,
        "accuracy_flexible": result.accuracy_flexible,
        "realized_fraction": result.realized_fraction,
        "realized_percent": 100 * result.realized_fraction,
        "realized_fraction_per_layer": result.realized_fraction_per_layer,
        "realized_fraction_prompts": result.realized_fraction_prompts,
        "decision": result.decision,
        "use_cache": result.use_cache,
        "n": result.n,
        "n_forward_sequences": result.n_forward_passes,
        "n_generated_tokens": result.n_generated_tokens,
        "correct": result.correct,
        "correct_norm": None,
        "correct_flexible": result.correct_flexible,
        "loglikelihoods": None,
        "gold": result.golds,
        "generations": result.generations,
        "answers": result.answers,
        "doc_ids": [req.doc_id for req in requests],
        "subjects": None,
        "per_subject": {},
        "savings": result.savings,
    }


def reused_record(config: SweepConfig, rid: str, key: str, q: float, tau: float, baseline: RunRecord) -> RunRecord:
    """The record of a run that zeroes nothing by construction: the baseline's outcomes."""
    return baseline.reused(rid, key, run_label(config, key), q, tau, ablation_for(config, key, tau).to_dict())


def write_reused_runs(config: SweepConfig, out: Path, thresholds: dict[str, Thresholds]) -> None:
    """Write the records of the runs that reuse the baseline's (once the baseline is in)."""
    base_path = record_path(out, BASELINE)
    if not base_path.is_file():
        return
    baseline = read_record(base_path)
    for rid, key, q in config.run_ids():
        if config.reuses_baseline(key, q) and not record_path(out, rid).is_file():
            write_record(out, reused_record(config, rid, key, q, thresholds[key].at(q), baseline))


def pending_runs(config: SweepConfig, out: Path) -> list[tuple[str, str, float | None]]:
    """Ablated runs still to evaluate (not finished, not reusing the baseline)."""
    return [(rid, key, q) for rid, key, q in config.run_ids()
            if key is not None and not config.reuses_baseline(key, q) and not record_path(out, rid).is_file()]



def read_thresholds(out: Path) -> dict[str, Thresholds]:
    """``thresholds.json`` by score key (empty before the baseline pass has run)."""
    path = out / "thresholds.json"
    if not path.is_file():
        return {}
    data = read_json_file(path)
    if not all(isinstance(v, dict) for v in data.values()):
        raise UserError(f"'{path}' is not a thresholds file of inactive-heads (each key maps to a dict); "
                        "the folder is damaged: rerun the sweep into a new folder")
    return {k: Thresholds.from_dict(v) for k, v in data.items()}


def read_record(path: Path) -> RunRecord:
    """One run record, checked for a format this version reads."""
    return RunRecord.from_json(read_json_file(path, keys=("score", "p")), path)


def _record_files(out: Path) -> dict[Path, RunRecord]:
    return {f: read_record(f) for f in sorted((out / "runs").glob("*.json"))}


def read_records(out: Path) -> dict[str, RunRecord]:
    """Every finished run's record by run id, each checked for a format this version reads."""
    records = {}
    for rec in _record_files(out).values():
        # folders of earlier versions: ids 'x@p=0.30'; one of a sweep's ablations has no p, its key is its id
        records[rec.score if rec.score and rec.p is None else run_id(rec.score, rec.p)] = rec
    return records
