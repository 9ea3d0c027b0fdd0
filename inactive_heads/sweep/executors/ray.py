"""Sweeps on Ray: the same records as the local executor, from actors that each keep one model.

``run_sweep(config, out, executor="ray")`` runs the sweep's one sequence
(:func:`~inactive_heads.sweep.sequence.run_sequence`) with :class:`RayExecutor`. Ray starts
embedded on this machine, or joins a running cluster (``address="auto"`` or ``"ray://host:port"``).
Each worker is a Ray actor that loads the model and tokenizes the task once, then evaluates shards
on request, each through the local executor's pass (:func:`~inactive_heads.sweep.passes.evaluate_run`).

Placement: by default as many workers as the cluster's CPUs // ``threads_per_worker`` (with
``gpus_per_worker``: as many as its GPUs allow, each worker also holding its CPU threads). The
workers are reserved together in one placement group; if Ray cannot place them within
:data:`PLACEMENT_TIMEOUT_S` seconds, the sweep stops with a one-line error that names what was
asked and what the cluster has, instead of waiting forever. Every worker imports
``config.imports`` before anything else (scores registered in user code); an embedded Ray
passes the driver's ``sys.path`` to its workers, so what the driver can import they can too.

Shards are contiguous blocks of whole batches in the evaluator's own batch order (inputs sorted
longest first, as :func:`inactive_heads.runtime.hooks.make_batches` does), so every forward pass sees the
very batch the local executor would give it: log-likelihoods, scores and dynamic decisions are
equal to the last bit. Sequence ids stay global (Random draws are seeded by them).

Step 1: the baseline pass, one task per shard, also records the calibration scores; the driver
pools them in input order and calibrates exactly as the local executor does. Step 2: every
(run, shard) is a task. Each finished task is written atomically to
``shards/<run id>/<shard>.json``; when a run's shards are all in, a worker assembles the run record
(``runs/<run id>.json``) with the evaluator's own summary step. A worker that dies is restarted and
its task re-run (Ray's ``max_restarts``/``max_task_retries``); a driver that is interrupted resumes
from the shard files, never re-running a finished shard or rewriting a finished record.

Generation tasks (gsm8k) shard their questions the same way, in the batch order their prompts'
scores are recorded in, so the calibration scores are equal to the last bit. A shard generates
with each question's index in the whole sweep as its prompt id (Random draws as in one local run)
and returns each question's outcome and the run's counts: zeroed heads over forward passes, and in
``decision="prompt"`` also over prompts, with each prompt's held heads. The record is assembled from
the counts summed over the shards (:func:`merge_generation_shards`), never from averaged fractions.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ...ablation.head_ablation import ablation_from_spec
from ...analysis.tables import BASELINE
from ...core.errors import UserError
from ...core.io import write_json_atomic
from ...scoring.calibration import Thresholds
from ..config import SweepConfig, ablation_for, device_type, run_threshold
from ..folder import make_record, record_path, write_record
from ..record import RunRecord
from ..passes import evaluate_run, load_model_for, plan_for, scores_description, sweep_inputs

MAX_RESTARTS = 3
PLACEMENT_TIMEOUT_S = 120.0  # how long Ray may take to find room for the workers
# A generation shard's outcome per question, put back in question order when its run is assembled.
GENERATION_QUESTION_FIELDS = ("generations", "answers", "correct", "correct_flexible", "n_generated_per_question")


def shard_layout(inputs: list[list[int]], batch_size: int, n_shards: int) -> list[list[int]]:
    """Input indices of each shard: contiguous runs of whole batches in the evaluator's batch order."""
    from ...runtime.hooks import make_batches

    batches = [b.indices.tolist() for b in make_batches(inputs, batch_size)]
    n_shards = max(1, min(n_shards, len(batches)))
    per = math.ceil(len(batches) / n_shards)
    return [sum(batches[k:k + per], []) for k in range(0, len(batches), per)]


class Worker:
    """One model, loaded once; evaluates shards of the sweep's plan (wrapped by ``ray.remote``)."""

    def __init__(self, config: dict[str, Any], threads: int):
        import torch

        torch.set_num_threads(threads)
        self.config = SweepConfig.from_dict(config).validate()  # imports config.imports first
        self.model = load_model_for(self.config, progress=False)
        self.plan = plan_for(self.config, self.model)

    def environment(self) -> dict[str, Any]:
        """What this worker computes in: the model's dtype and device, and its torch threads."""
        import torch

        from ...models.loading import model_info
        from ...runtime.hooks import model_device

        return {"dtype": model_info(self.model).dtype, "device": str(model_device(self.model)),
                "threads": torch.get_num_threads()}

    def layout(self, n_shards: int) -> list[list[int]]:
        return shard_layout(sweep_inputs(self.config, self.plan), self.config.batch_size, n_shards)

    def run_shard(self, rid: str, shard: int, indices: list[int], spec: dict | None,
                  record: list[str] | None) -> dict[str, Any]:
        ablation = None if spec is None else ablation_from_spec(spec)
        shard_of = self._generation_shard if self.config.is_generation else self._likelihood_shard
        out, result = shard_of(indices, ablation, record or None)
        out.update(run_id=rid, shard=shard, inputs=indices)
        if result.head_scores is not None:
            out["scores"] = {k: v.clone() for k, v in result.head_scores.scores.items()}
        return out

    def _likelihood_shard(self, indices: list[int], ablation, record: list[str] | None) -> tuple[dict[str, Any], Any]:
        sub = self.plan.subset(indices)
        result = evaluate_run(self.config, self.model, sub, ablation, progress=False, record=record)
        lls = [[sub.request_ids[r], c, result.loglikelihoods[r][c]]
               for targets in sub.targets for r, c, _, _ in targets]
        return {
            "loglikelihoods": lls, "n_sequences": len(indices), "seconds": result.seconds,
            "flagged_per_layer": ablation.stats.flagged_per_layer.tolist() if ablation is not None else None,
            # each input's flags, bit-packed as hex in the order of "inputs" (the record's oracle savings)
            "flagged": None if result.flagged is None else _pack_flags(result.flagged),
        }, result

    def _generation_shard(self, indices: list[int], ablation, record: list[str] | None) -> tuple[dict[str, Any], Any]:
        """Generate for the shard's questions, each under its index in the sweep; return each
        question's outcome and the counts :func:`merge_generation_shards` sums (None: no ablation)."""
        import torch

        requests = [self.plan[i] for i in indices]
        result = evaluate_run(self.config, self.model, requests, ablation, progress=False, record=record,
                              prompt_ids=indices)
        out = {name: getattr(result, name) for name in GENERATION_QUESTION_FIELDS}
        out.update(n_forward_passes=result.n_forward_passes, use_cache=result.use_cache, seconds=result.seconds,
                   zeroed=None, zeroed_prompts=None, flagged=None)
        if ablation is not None:
            stats = ablation.stats
            if self.config.decision == "per_step":  # one decision per forward pass
                out["zeroed"] = _counts(stats.n_sequences, stats.flagged_per_layer)
            else:  # each prompt's held heads count once per token it generated (one forward pass each)
                masks = torch.stack([stats.masks[i] for i in indices])  # stats are keyed by the prompt ids
                tokens = torch.tensor(result.n_generated_per_question, dtype=torch.long)
                out["zeroed"] = _counts(int(tokens.sum()), (tokens[:, None] * masks.sum(dim=2)).sum(dim=0))
                out["zeroed_prompts"] = _counts(stats.n_sequences, stats.flagged_per_layer)
                out["flagged"] = _pack_flags(masks)
        return out, result

    def assemble(self, rid: str, key: str | None, q: float | None, tau: float | None,
                 shards: list[dict[str, Any]]) -> RunRecord:
        """The run record from its shards, through the evaluator's own summary step."""
        from ...evaluation.evaluator import summarize
        from ...models.loading import model_info

        if self.config.is_generation:
            return self._assemble_generation(rid, key, q, tau, shards)
        lls = [[0.0] * len(req.choices) for req in self.plan.requests]
        for part in shards:
            for r, c, ll in part["loglikelihoods"]:
                lls[r][c] = ll
        stats = None
        if key is not None:
            info = model_info(self.model)
            masks = {} if any(p.get("flagged") is None for p in shards) else {
                i: m for p in shards for i, m in zip(p["inputs"], _unpack_flags(p["flagged"], info.n_layers,
                                                                                  info.n_heads))}
            stats = _summed_stats(shards, info.n_layers, info.n_heads, masks)
        result = summarize(self.plan, lls, stats=stats)
        result.seconds = round(sum(p["seconds"] for p in shards), 3)
        return make_record(self.config, rid, key, q, tau, result, self.plan, self.model)

    def _assemble_generation(self, rid: str, key: str | None, q: float | None, tau: float | None,
                             shards: list[dict[str, Any]]) -> RunRecord:
        """A generation run's record from its shards: the merged counts, and in prompt mode the
        savings of every question's held heads (the local executor's own computation)."""
        import torch

        from ...evaluation.decoding import held_savings
        from ...evaluation.generation import GenerationResult, check_prompts
        from ...evaluation.gsm8k import GSM8K_MAX_GEN_TOKS
        from ...models.loading import model_info

        info = model_info(self.model)
        merged = merge_generation_shards(shards, info.n_layers, info.n_heads)
        per_pass, per_prompt, flagged = merged.pop("zeroed"), merged.pop("zeroed_prompts"), merged.pop("flagged")
        savings = None
        if self.config.decision == "prompt":
            max_new = GSM8K_MAX_GEN_TOKS if self.config.max_gen_toks is None else self.config.max_gen_toks
            prompts = check_prompts(self.model, sweep_inputs(self.config, self.plan), max_new)  # as generate cuts them
            if flagged is None:  # no ablation: nothing held, as the local run counts it
                flagged = torch.zeros((len(self.plan), info.n_layers, info.n_heads), dtype=torch.bool)
            savings = held_savings(self.model, prompts, flagged, merged["n_generated_per_question"])
        n = len(self.plan)
        result = GenerationResult(
            task=self.config.task, accuracy=sum(merged["correct"]) / n,
            accuracy_flexible=sum(merged["correct_flexible"]) / n, n=n, golds=[r.gold for r in self.plan],
            decision=self.config.decision,
            realized_fraction=0.0 if per_pass is None else per_pass.realized_fraction,
            realized_fraction_per_layer=[] if per_pass is None else per_pass.realized_fraction_per_layer,
            realized_fraction_prompts=None if per_prompt is None else per_prompt.realized_fraction,
            n_generated_tokens=sum(merged["n_generated_per_question"]), savings=savings, **merged)
        return make_record(self.config, rid, key, q, tau, result, self.plan, self.model)

    def pooled_scores(self, shards: list[dict[str, Any]], seconds: float):
        """The shards' recorded scores in input order, with the metadata record_scores gives."""
        import torch

        from ...scoring.recording import HeadScores, scores_metadata

        order = torch.tensor(sum((p["inputs"] for p in shards), []), dtype=torch.long)
        scores = {}
        for key in shards[0]["scores"]:
            stacked = torch.cat([p["scores"][key] for p in shards])
            full = torch.empty_like(stacked)
            full[order] = stacked
            scores[key] = full
        meta = scores_metadata(self.model, list(scores), sweep_inputs(self.config, self.plan),
                               description=scores_description(self.config, self.plan),
                               batch_size=self.config.batch_size, seed=0, seconds=seconds)
        return HeadScores(scores, meta)


def merge_generation_shards(parts: list[dict[str, Any]], n_layers: int, n_heads: int) -> dict[str, Any]:
    """A generation run's fields from its shards (``GenerationResult`` names, and three more).

    Each question's outcome is put back in question order (``inputs`` are the questions' indices in
    the sweep); the counts are summed. ``zeroed`` (zeroed heads over forward passes) and, in prompt
    mode, ``zeroed_prompts`` (over prompts) become :class:`AblationStats` whose fractions are zeroed
    triples over all triples of all shards, not an average of the shards' fractions (shards differ
    in size); None without an ablation. ``flagged``: each question's held heads in prompt mode, as
    ``[question, layer, head]`` flags, or None.
    """
    import torch

    order = [i for p in parts for i in p["inputs"]]
    merged: dict[str, Any] = {}
    for name in GENERATION_QUESTION_FIELDS:
        values = [None] * len(order)
        for i, value in zip(order, (v for p in parts for v in p[name])):
            values[i] = value
        merged[name] = values
    merged["n_forward_passes"] = sum(p["n_forward_passes"] for p in parts)
    merged["use_cache"] = parts[0]["use_cache"]
    merged["seconds"] = round(sum(p["seconds"] for p in parts), 3)
    for name in ("zeroed", "zeroed_prompts"):
        counts = [p[name] for p in parts]
        merged[name] = None if counts[0] is None else _summed_stats(counts, n_layers, n_heads)
    merged["flagged"] = None
    if parts[0]["flagged"] is not None:
        merged["flagged"] = torch.zeros((len(order), n_layers, n_heads), dtype=torch.bool)
        merged["flagged"][torch.tensor(order)] = torch.cat([_unpack_flags(p["flagged"], n_layers, n_heads)
                                                            for p in parts])
    return merged


def _counts(n_sequences: int, flagged_per_layer) -> dict[str, Any]:
    """Zeroed heads per layer over ``n_sequences`` forward passes: what a shard's run merges from."""
    return {"n_sequences": int(n_sequences), "flagged_per_layer": [int(x) for x in flagged_per_layer]}


def _summed_stats(counts: list[dict[str, Any]], n_layers: int, n_heads: int, masks=None):
    """One :class:`AblationStats` of the shards' counts (``n_sequences``, ``flagged_per_layer``), summed."""
    import torch

    from ...ablation.stats import AblationStats

    flagged = torch.tensor([c["flagged_per_layer"] for c in counts], dtype=torch.long).sum(dim=0)
    return AblationStats(n_layers, n_heads, n_sequences=sum(c["n_sequences"] for c in counts),
                         flagged_per_layer=flagged, masks=masks or {})


def _pack_flags(flags) -> list[str]:
    """``[input, layer, head]`` booleans as one hex string of packed bits per input (JSON-sized).

    >>> import torch
    >>> flags = torch.tensor([[[True, False, True]], [[False, False, False]]])
    >>> _pack_flags(flags), bool(torch.equal(_unpack_flags(_pack_flags(flags), 1, 3), flags))
    (['a0', '00'], True)
    """
    import numpy as np

    return [np.packbits(row.flatten().bool().numpy()).tobytes().hex() for row in flags.cpu()]


def _unpack_flags(packed: list[str], n_layers: int, n_heads: int):
    """Inverse of :func:`_pack_flags`: a ``[input, layer, head]`` bool tensor."""
    import numpy as np
    import torch

    n = n_layers * n_heads
    rows = [np.unpackbits(np.frombuffer(bytes.fromhex(h), dtype=np.uint8))[:n] for h in packed]
    return torch.from_numpy(np.stack(rows).astype(bool)).reshape(len(packed), n_layers, n_heads) if rows else \
        torch.zeros((0, n_layers, n_heads), dtype=torch.bool)


# ----------------------------------------------------------------------------------------------
# The driver's side


class RayExecutor:
    """Runs a sweep's passes on Ray actors (:class:`~inactive_heads.sweep.sequence.Executor`):
    ``run_sweep(..., executor="ray")``. Ray is imported here, when this executor is chosen."""

    def __init__(self, config: SweepConfig, out: Path, *, address: str | None = None, workers: int | None = None,
                 gpus_per_worker: float | None = None, threads_per_worker: int | None = None,
                 shards: int | None = None, progress: bool = True):
        import ray

        threads = threads_per_worker or 1
        if threads < 1 or (workers is not None and workers < 1) or (gpus_per_worker is not None and gpus_per_worker < 0):
            raise UserError(f"workers and threads_per_worker must be >= 1 and gpus_per_worker >= 0, got "
                             f"workers={workers}, threads_per_worker={threads_per_worker}, gpus_per_worker={gpus_per_worker}")
        self.ray, self.config, self.out, self.progress = ray, config, out, progress
        self.address, self.workers, self.threads, self.gpus = address, workers, threads, float(gpus_per_worker or 0)
        self.shards = shards
        self.started, self.pool, self.group, self._shard_layout = False, [], None, None

    def start(self) -> SweepConfig:
        self.started = _connect(self.ray, self.address, self.workers, self.threads)
        self.pool, self.group = _start_workers(self.ray, self.config, self.workers, self.threads, self.gpus)
        return _resolved(self.ray, self.config, self.pool)

    @property
    def layout(self) -> list[list[int]]:
        """The shard layout, read or fixed (once ``sweep.json`` is written) on first use."""
        if self._shard_layout is None:
            self._shard_layout = _layout(self.ray, self.out, self.pool, self.shards or 2 * len(self.pool))
        return self._shard_layout

    def baseline(self, scores: bool, record: bool):
        """Step 1: the unablated pass per shard (recording the scores), pooled in input order by a worker."""
        ray, pool, layout = self.ray, self.pool, self.layout
        recorded = tuple(self.config.scores) if scores else None
        tasks = [(BASELINE, None, None, None, k, recorded) for k in range(len(layout))]
        parts = _execute(ray, self.config, self.out, pool, layout, tasks, {BASELINE: (None, None, None)},
                         self.progress, "baseline shards")
        if not scores:
            return None
        return ray.get(pool[0].pooled_scores.remote(parts[BASELINE], sum(p["seconds"] for p in parts[BASELINE])))

    def runs(self, todo: list[tuple[str, str, float | None]], thresholds: dict[str, Thresholds]) -> None:
        """Step 2: every (run, shard) of the runs still to do."""
        runs = {rid: (key, q, run_threshold(thresholds, key, q)) for rid, key, q in todo}
        tasks = [(rid, key, q, tau, k, None) for rid, (key, q, tau) in runs.items() for k in range(len(self.layout))]
        _execute(self.ray, self.config, self.out, self.pool, self.layout, tasks, runs, self.progress, "sweep shards")

    def close(self) -> None:
        for actor in self.pool:
            self.ray.kill(actor)
        self.pool = []
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None
        if self.started:
            self.ray.shutdown()
            self.started = False


def _connect(ray, address: str | None, workers: int | None, threads: int) -> bool:
    """Join ``address`` or start Ray here; True when this call started it (and must stop it).

    Embedded, Ray gets this machine's CPUs (or ``workers * threads`` when more are asked for) and
    its GPUs, and its workers get the driver's ``sys.path``, so that ``config.imports`` and the
    modules they import resolve there as they do here.
    """
    if ray.is_initialized():
        return False
    if address is None:
        cpus = os.cpu_count() or 1
        if workers is not None:
            cpus = max(cpus, workers * threads)
        path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    else:
        ray.init(address=address, log_to_driver=False)
    return True


def pool_size(resources: dict[str, float], workers: int | None, threads: int, gpus: float) -> int:
    """How many workers to start: ``workers``, or as many as ``resources`` (Ray's cluster
    resources) hold: CPUs // threads, and with GPUs per worker, at most GPUs // gpus.

    >>> pool_size({"CPU": 16.0, "GPU": 4.0}, None, 2, 0.0), pool_size({"CPU": 16.0, "GPU": 4.0}, None, 2, 1.0)
    (8, 4)
    """
    if workers is not None:
        return workers
    n = int(resources.get("CPU", 0) // threads)
    if gpus:
        n = min(n, int(resources.get("GPU", 0) // gpus))
    if n < 1:
        raise UserError(f"the Ray cluster has {_describe(resources)}: not enough for one worker of {_demand(threads, gpus)}; "
                        "lower --threads-per-worker or --gpus-per-worker, or add machines")
    return n


def _describe(resources: dict[str, float]) -> str:
    return f"{resources.get('CPU', 0):g} CPU(s) and {resources.get('GPU', 0):g} GPU(s)"


def _demand(threads: int, gpus: float) -> str:
    return f"{threads} CPU thread(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")


def _start_workers(ray, config: SweepConfig, workers: int | None, threads: int, gpus: float) -> tuple[list, Any]:
    """Reserve the workers' resources together (a placement group), within
    :data:`PLACEMENT_TIMEOUT_S`, then start one actor in each reservation."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n = pool_size(ray.cluster_resources(), workers, threads, gpus)
    bundle = {"CPU": threads, **({"GPU": gpus} if gpus else {})}
    group = placement_group([bundle] * n, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise UserError(f"Ray could not place {n} worker(s) of {_demand(threads, gpus)} each within "
                        f"{PLACEMENT_TIMEOUT_S:g} s (the cluster has {_describe(ray.cluster_resources())}, "
                        f"{_describe(ray.available_resources())} free); lower --workers, --threads-per-worker "
                        "or --gpus-per-worker")
    try:
        remote = ray.remote(Worker)
        pool = [
            remote.options(num_cpus=threads, num_gpus=gpus, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
                           scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k))
            .remote(config.to_dict(), threads)
            for k in range(n)
        ]
    except BaseException:
        remove_placement_group(group)  # nothing held when the actors cannot start
        raise
    return pool, group


def _resolved(ray, config: SweepConfig, pool) -> SweepConfig:
    """The config resolved by the workers' models: one dtype and one device type for all."""
    seen = sorted({(env["dtype"], device_type(env["device"])) for env in ray.get([a.environment.remote() for a in pool])})
    if len(seen) > 1:
        raise UserError(f"the Ray workers compute in {' and in '.join(f'{d} on {t}' for d, t in seen)}; one sweep's "
                        "numbers come from one dtype and device type: set --dtype and --device, or --gpus-per-worker")
    dtype, device = seen[0]
    return config.resolved(dtype=dtype, device=device)


def _layout(ray, out: Path, pool, n_shards: int) -> list[list[int]]:
    """The shard layout, fixed at the folder's first Ray run (``shards/layout.json``)."""
    path = out / "shards" / "layout.json"
    if path.is_file():
        return json.loads(path.read_text())
    layout = ray.get(pool[0].layout.remote(n_shards))
    write_json_atomic(path, layout)
    return layout


def shard_path(out: Path, rid: str, shard: int) -> Path:
    return out / "shards" / rid / f"{shard}.json"


def _read_shard(out: Path, rid: str, shard: int) -> dict[str, Any]:
    import torch

    part = json.loads(shard_path(out, rid, shard).read_text())
    scores_file = shard_path(out, rid, shard).with_suffix(".safetensors")
    if scores_file.is_file():
        from ...scoring.recording import HeadScores

        part["scores"] = {k: torch.as_tensor(v) for k, v in HeadScores.load(scores_file).scores.items()}
    return part


def _write_shard(out: Path, part: dict[str, Any]) -> None:
    """Scores first, then the JSON: a shard counts as done once its JSON exists."""
    path = shard_path(out, part["run_id"], part["shard"])
    if "scores" in part:
        from ...scoring.recording import HeadScores

        HeadScores(part["scores"], {"shard": part["shard"]}).save(path.with_suffix(".safetensors"))
    write_json_atomic(path, {k: v for k, v in part.items() if k != "scores"})


def _execute(ray, config: SweepConfig, out: Path, pool, layout, tasks, runs, progress: bool, desc: str) -> dict[str, list]:
    """Run the tasks whose shard file is missing on idle workers; write each result as it
    arrives; assemble (and write) each run's record once all its shards are in."""
    done = {t for t in tasks if shard_path(out, t[0], t[4]).is_file()}
    queue = [t for t in tasks if t not in done]
    parts: dict[str, dict[int, dict]] = {rid: {} for rid in runs}
    for t in done:
        parts[t[0]][t[4]] = _read_shard(out, t[0], t[4])
    bar = tqdm(total=len(tasks), initial=len(done), desc=desc, unit="shard", disable=not progress)
    idle, running = list(pool), {}
    for rid in runs:
        _assemble_if_complete(ray, out, rid, runs[rid], parts[rid], len(layout), idle[0])
    while queue or running:
        while queue and idle:
            t = queue.pop(0)
            actor = idle.pop(0)
            spec = ablation_for(config, t[1], t[3])
            spec = spec.to_dict() if spec is not None else None
            running[actor.run_shard.remote(t[0], t[4], layout[t[4]], spec, list(t[5] or []))] = actor
        ready, _ = ray.wait(list(running), num_returns=1)
        actor = running.pop(ready[0])
        part = ray.get(ready[0])
        _write_shard(out, part)
        parts[part["run_id"]][part["shard"]] = part
        bar.update(1)
        _assemble_if_complete(ray, out, part["run_id"], runs[part["run_id"]], parts[part["run_id"]],
                              len(layout), actor)
        idle.append(actor)
    bar.close()
    return {rid: [parts[rid][k] for k in sorted(parts[rid])] for rid in runs}


def _assemble_if_complete(ray, out: Path, rid: str, run, parts: dict[int, dict], n_shards: int, actor) -> None:
    if len(parts) < n_shards or record_path(out, rid).is_file():
        return
    key, q, tau = run
    record = ray.get(actor.assemble.remote(rid, key, q, tau, [parts[k] for k in range(n_shards)]))
    write_record(out, record)


__all__ = ["RayExecutor", "Worker", "merge_generation_shards", "pool_size", "shard_layout"]
