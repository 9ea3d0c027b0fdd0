"""A sweep's cost before it runs: :func:`estimate_sweep` (``inactive-heads sweep --estimate``).

The estimate loads the model and plans the inputs as the sweep would (:mod:`.passes`), lists the
passes the sweep would run (the baseline, recording the scores when thresholds are calibrated; the
p = 0 runs that reuse the baseline's record and cost nothing; every pending run), and counts the
work of each pass from its inputs: forward batches, tokens, and padded tokens (rows x width of each
length-sorted batch, what the forward computes). With ``reuse_prefix`` a pass that can reuse a
prefix counts each shared prefix once per group (one decision history) and the rest of each input
after it. It then times a sample of real passes, after one warm-up batch: a few batches of the
baseline pass (recording, if the sweep records) and the same batches under one ablated run, and
scales each by padded tokens to the whole sweep. A generation task (gsm8k) generates one batch of
prompts and scales by prompts (generated lengths vary: a projection, not a bound).

Peak memory is measured on the sample: ``torch.cuda.max_memory_allocated`` on CUDA (the sample
holds the longest batch, which sets the activations' peak), else the process's peak resident
memory (``VmHWM`` in ``/proc/self/status``: weights, inputs and the sample's activations). The
estimate runs nothing else and writes nothing into the results folder.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..analysis.tables import BASELINE
from ..core.errors import UserError
from .config import SweepConfig, ablation_for, thresholds_for
from .folder import find_scores_file, pending_runs, record_path
from .passes import check_model_matches, evaluate_run, load_model_for, plan_for, resolved_for
from ..runtime.hooks import model_device

SAMPLE_BATCHES = 3  # timed batches of each sampled pass, spread over the length-sorted batches


@dataclass
class PassWork:
    """The work of one pass: forward inputs, batches, tokens and padded tokens (rows x width)."""

    inputs: int = 0
    batches: int = 0
    tokens: int = 0
    padded_tokens: int = 0

    def __add__(self, other: "PassWork") -> "PassWork":
        return PassWork(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    def times(self, n: int) -> "PassWork":
        return PassWork(*(n * v for v in asdict(self).values()))


def batch_work(lengths: list[int], batch_size: int) -> PassWork:
    """The work of ``lengths`` in length-sorted batches of ``batch_size`` (as ``make_batches`` forms them).

    >>> batch_work([5, 3, 9, 2], 2)
    PassWork(inputs=4, batches=2, tokens=19, padded_tokens=24)
    """
    ordered = sorted(lengths, reverse=True)
    chunks = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    return PassWork(len(ordered), len(chunks), sum(ordered), sum(len(c) * c[0] for c in chunks))


def plan_work(plan, batch_size: int, reuse: bool) -> PassWork:
    """The work of one scoring pass over ``plan`` (an ``EvalPlan``); with ``reuse``, as the
    evaluator groups inputs by prefix: each group's prefix once (one token row, no batch of its
    own), the rest of each member after it."""
    if not reuse:
        return batch_work([len(x) for x in plan.inputs], batch_size)
    from ..runtime.prefix import group_by_prefix

    limits = [min(first for _, _, first, _ in targets) for targets in plan.targets]
    groups, alone = group_by_prefix(plan.inputs, limits)
    work = batch_work([len(plan.inputs[i]) for i in alone], batch_size)
    for group in groups:
        prefix = len(group.tokens)
        work += batch_work([len(plan.inputs[i]) - prefix for i in group.members], batch_size)
        work += PassWork(0, 0, prefix, prefix)
    return work


def peak_memory(device: str) -> tuple[int, str]:
    """The peak memory so far, in bytes, and how it was measured."""
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS (getrusage, whole process)"
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return kib * 1024, "VmHWM (peak resident memory of the whole process)"


@dataclass
class Estimate:
    """The projected wall time and peak memory of a sweep, and how they were projected."""

    seconds: float
    peak_bytes: int
    projection: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "peak_bytes": self.peak_bytes, "projection": self.projection}

    def summary(self) -> str:
        p = self.projection
        counts = p["passes"]
        return (f"estimate: {_clock(self.seconds)} wall, peak memory {self.peak_bytes / 2**30:.2f} GiB "
                f"({p['peak_memory']}); {counts['baseline']} baseline pass, {counts['ablated']} ablated, "
                f"{counts['reused']} reused from the baseline, {p['work']['total']['padded_tokens']:,} "
                f"padded tokens in {p['work']['total']['batches']} batches, on {p['device']} in {p['dtype']}")


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def sweep_passes(config: SweepConfig, out: Path | None) -> dict[str, Any]:
    """What the sweep would run into ``out`` (None: a new folder): whether the baseline pass runs
    (and records the scores), the reused p = 0 runs, and the pending (run id, key, p)."""
    have_record = out is not None and record_path(out, BASELINE).is_file()
    have_scores = out is not None and find_scores_file(out) is not None
    records = config.records_scores and not have_scores
    runs = pending_runs(config, out) if out is not None else [
        (rid, key, q) for rid, key, q in config.run_ids() if key is not None and not config.reuses_baseline(key, q)]
    reused = [rid for rid, key, q in config.run_ids() if config.reuses_baseline(key, q)
              and not (out is not None and record_path(out, rid).is_file())]
    return {"baseline": records or not have_record, "records": records, "pending": runs, "reused": reused}


def _sync(model):
    import torch

    if torch.cuda.is_available() and (model is None or model_device(model).type == "cuda"):
        torch.cuda.synchronize()


def _timed(fn, model) -> tuple[Any, float]:
    _sync(model)
    start = time.perf_counter()
    value = fn()
    _sync(model)
    return value, time.perf_counter() - start


def sample_indices(plan, batch_size: int, n_batches: int = SAMPLE_BATCHES) -> tuple[list[int], list[int]]:
    """(warm-up inputs, sampled inputs): one batch to warm up, and ``n_batches`` whole batches
    spread over the length-sorted batches (the longest first, the shortest last)."""
    order = sorted(range(len(plan.inputs)), key=lambda i: (-len(plan.inputs[i]), i))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if len(chunks) <= n_batches:
        picked = list(range(len(chunks)))
    else:
        picked = sorted({round(k * (len(chunks) - 1) / (n_batches - 1)) for k in range(n_batches)})
    return sorted(chunks[picked[0]]), sorted(i for c in picked for i in chunks[c])


def _sample_run(config: SweepConfig, todo) -> tuple[str, str, float | None] | None:
    """The run whose pass is timed for the ablated runs: the first pending run that is not static."""
    from ..scoring.scores import STATIC_SUFFIX

    return next((run for run in todo if not run[1].endswith(STATIC_SUFFIX)), None)


def _ablation_of(config: SweepConfig, key: str, q, head_scores):
    """The ablation of run (key, q), its τ calibrated on ``head_scores`` (the sample's)."""
    from ..ablation.coerce import as_ablation
    from ..ablation.head_ablation import AblationSpec
    from ..scoring.scores import STATIC_SUFFIX

    if key.endswith(STATIC_SUFFIX):
        return as_ablation(AblationSpec("static", heads=((0, 0),)))
    tau = None if q is None else thresholds_for(config, key, head_scores).at(q)
    return as_ablation(ablation_for(config, key, tau))


def _reuses(config: SweepConfig, model, ablation) -> bool:
    from ..runtime.prefix import supports_prefix_reuse

    return config.reuse_prefix and config.evaluate_attention != "eager" and supports_prefix_reuse(model, ablation)


def estimate_sweep(config: SweepConfig, out=None, *, model=None) -> Estimate:
    """The projected wall time and peak memory of ``run_sweep(config, out)`` (local executor) on
    this machine; ``out`` None or a folder not yet there: a new sweep, else what is left to run
    there. ``model``: as :func:`~inactive_heads.sweep.run.run_sweep` takes it (then its loading is
    not counted). Validates ``config``; writes nothing."""
    from .folder import check_folder

    config.validate()
    out = None if out is None else Path(out)
    if out is not None and out.exists():
        check_folder(config, out)
    load_s = 0.0
    if model is None:
        model, load_s = _timed(lambda: load_model_for(config, progress=False), None)
    else:
        check_model_matches(config, model)
    plan, plan_s = _timed(lambda: plan_for(config, model), model)
    resolved = resolved_for(config, model)
    passes = sweep_passes(config, out if out is not None and out.exists() else None)
    if passes["baseline"] or passes["pending"]:
        measure = _measure_generation if config.is_generation else _measure_choice
        parts, projection = measure(config, model, plan, passes, out)
    else:  # nothing left to run: nothing to time
        parts, projection = {}, {"method": "nothing left to run", "work": {"total": asdict(PassWork())}}
    parts = {"load_model": load_s, "plan_inputs": plan_s, **parts}
    seconds = sum(parts.values())
    peak, how = peak_memory(str(model_device(model)))
    return Estimate(round(seconds, 1), peak, {
        "model": config.model, "task": config.task, "device": resolved.device, "dtype": resolved.dtype,
        "passes": {"baseline": int(passes["baseline"]), "records_scores": passes["records"],
                   "ablated": len(passes["pending"]), "reused": len(passes["reused"])},
        **projection,
        "seconds_by_part": {k: round(v, 2) for k, v in parts.items()},
        "peak_memory": how,
    })


def _load_scores(out: Path | None):
    from ..scoring.recording import HeadScores

    path = None if out is None else find_scores_file(out)
    return HeadScores.load(path) if path is not None else None


def _measure_choice(config: SweepConfig, model, plan, passes, out) -> tuple[dict[str, float], dict[str, Any]]:
    """Time the sample of a log-likelihood sweep and project each pass by padded tokens."""
    bs, keys = config.batch_size, list(config.scores)
    warm, sample = sample_indices(plan, bs)
    sample_plan = plan.subset(sample)
    record = keys if config.records_scores else None
    evaluate_run(config, model, plan.subset(warm), None, progress=False, record=record)  # warm-up
    base, base_s = _timed(lambda: evaluate_run(config, model, sample_plan, None, progress=False,
                                               record=record if passes["records"] else None), model)
    scores = base.head_scores if base.head_scores is not None else _load_scores(out)
    if scores is None and config.records_scores:  # a resume whose baseline pass does not record
        scores = evaluate_run(config, model, sample_plan, None, progress=False, record=record).head_scores
    run = _sample_run(config, passes["pending"])
    rates = {"baseline": plan_work(sample_plan, bs, _reuses(config, model, None)).padded_tokens / base_s}
    sampled = {"inputs": len(sample), "warmup_inputs": len(warm), "baseline_seconds": round(base_s, 3),
               "baseline_records_scores": passes["records"]}
    if run is not None:
        ablation = _ablation_of(config, run[1], run[2], scores)
        _, abl_s = _timed(lambda: evaluate_run(config, model, sample_plan, ablation, progress=False), model)
        rates["ablated"] = plan_work(sample_plan, bs, _reuses(config, model, ablation)).padded_tokens / abl_s
        sampled.update(ablated_run=run[0], ablated_seconds=round(abl_s, 3))
    work = {"baseline": plan_work(plan, bs, _reuses(config, model, None)) if passes["baseline"] else PassWork()}
    ablated = PassWork()
    for _, key, q in passes["pending"]:
        ablated += plan_work(plan, bs, _reuses(config, model, _ablation_of(config, key, q, scores)))
    work["ablated"] = ablated
    parts = {"baseline_pass": work["baseline"].padded_tokens / rates["baseline"],
             "ablated_passes": ablated.padded_tokens / rates.get("ablated", rates["baseline"])}
    static = _static_calibration_work(config, model, passes, out)
    if static is not None:
        work["static_calibration"] = static
        parts["static_calibration"] = static.padded_tokens / rates["baseline"]
    total = sum(work.values(), PassWork())
    return parts, {
        "method": "padded tokens of each pass x seconds per padded token of a timed sample (real passes of "
                  f"up to {SAMPLE_BATCHES} length-sorted batches, after a warm-up batch)",
        "work": {k: asdict(v) for k, v in {**work, "total": total}.items()},
        "sample": sampled,
        "padded_tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
        "reuse_prefix": config.reuse_prefix and "each shared prefix counted once per group (one decision "
                        "history; dynamic runs that decide differently on a prefix compute it again)",
    }


def _static_calibration_work(config: SweepConfig, model, passes, out) -> PassWork | None:
    """The recording pass that chooses the static sets, when static runs are pending and their
    scores are not yet in the folder."""
    from ..scoring.scores import STATIC_SUFFIX
    from .folder import STATIC_SCORES_FILE
    from .passes import calibration_plan

    if not any(key.endswith(STATIC_SUFFIX) for _, key, _ in passes["pending"]):
        return None
    if out is not None and (out / STATIC_SCORES_FILE).is_file():
        return None
    return plan_work(calibration_plan(config, model), config.batch_size, False)


def _measure_generation(config: SweepConfig, model, requests, passes, out) -> tuple[dict[str, float], dict[str, Any]]:
    """Time one batch of prompts generated (baseline, then one ablated run) and project by prompts."""
    from .passes import record_prompt_scores

    sample = list(requests[:config.batch_size])
    ids = list(range(len(sample)))
    keys = list(config.scores) or ["awft"]
    record_prompt_scores(config, model, sample[:1], keys, False)  # warm-up: one forward of one prompt
    base, base_s = _timed(lambda: evaluate_run(config, model, sample, None, progress=False, prompt_ids=ids,
                                               record=config.scores if passes["records"] else None), model)
    scores = base.head_scores if base.head_scores is not None else _load_scores(out)
    if scores is None and config.records_scores:
        scores = record_prompt_scores(config, model, sample, keys, False)
    per_prompt = {"baseline": base_s / len(sample)}
    sampled = {"prompts": len(sample), "baseline_seconds": round(base_s, 3),
               "generated_tokens_baseline": base.n_generated_tokens}
    run = _sample_run(config, passes["pending"])
    if run is not None:
        ablation = _ablation_of(config, run[1], run[2], scores)
        abl, abl_s = _timed(lambda: evaluate_run(config, model, sample, ablation, progress=False,
                                                 prompt_ids=ids), model)
        per_prompt["ablated"] = abl_s / len(sample)
        sampled.update(ablated_run=run[0], ablated_seconds=round(abl_s, 3),
                       generated_tokens_ablated=abl.n_generated_tokens)
    n = len(requests)
    prompts = batch_work([len(r.context_ids) for r in requests], config.batch_size)
    parts = {"baseline_pass": n * per_prompt["baseline"] if passes["baseline"] else 0.0,
             "ablated_passes": len(passes["pending"]) * n * per_prompt.get("ablated", per_prompt["baseline"])}
    return parts, {
        "method": "seconds per prompt of one timed batch of prompts generated (baseline, and one ablated run) x "
                  "prompts x passes; generated lengths vary, so this projects, it does not bound",
        "work": {"prompts_per_pass": asdict(prompts), "max_gen_toks": config.max_gen_toks,
                 "total": asdict(prompts.times(int(passes["baseline"]) + len(passes["pending"])))},
        "sample": sampled,
        "seconds_per_prompt": {k: round(v, 3) for k, v in per_prompt.items()},
    }


def estimate_grid(grid) -> Estimate:
    """The projected wall time (the sum) and peak memory (the largest) of ``run_grid(grid)``, one
    :func:`estimate_sweep` per (model, task) cell, each into the folder the grid would use."""
    if grid.executor != "local":
        raise UserError("--estimate times the local executor on this machine; set executor = \"local\" in the "
                        "grid file to estimate it")
    cells = [estimate_sweep(grid.sweep_config(model, task), grid.folder(model, task)) for model, task in grid.cells()]
    first = cells[0].projection
    return Estimate(round(sum(c.seconds for c in cells), 1), max(c.peak_bytes for c in cells), {
        "method": "the sum of one sweep estimate per (model, task); peak memory: the largest",
        "device": first["device"], "dtype": first["dtype"],
        "passes": {k: sum(c.projection["passes"][k] for c in cells) for k in ("baseline", "ablated", "reused")},
        "work": {"total": {k: sum(c.projection["work"]["total"][k] for c in cells)
                           for k in asdict(PassWork())}},
        "peak_memory": first["peak_memory"],
        "cells": [c.to_dict() for c in cells],
    })
