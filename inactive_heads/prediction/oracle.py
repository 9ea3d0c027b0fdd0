"""The training data of a predictor: one in-pass oracle run (the paper's dynamic ablation) over a
task's inputs, keeping per (sequence, layer) the pooled residual stream entering the layer and
the oracle's flags; splitting by question; fitting and evaluating against held-out questions.

A multiple-choice task's inputs are its plan's forward inputs; a generation task's (GSM8K) are its
prompts, where the oracle decides once and holds the heads for every generated token
(``decision="prompt"``), so the predictor is fit and checked on that same prompt pass.

The features come from the oracle's own pass: the stream entering layer ``l`` already reflects the
oracle's zeroing in layers before ``l`` (the cascade), as a predictor running in place of the
oracle would see its own. Each feature is reduced inside the layer's hook (pooled to
``[batch, d_model]``); no ``[batch, pos, d_model]`` tensor outlives its layer.
"""

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..ablation.head_ablation import DynamicAblation, RandomAblation, StaticAblation
from ..core.errors import UserError
from ..core.io import write_json_atomic
from ..core.resume import check_same_setup
from ..evaluation.evaluator import evaluate
from ..evaluation.plan import EvalPlan
from ..models.loading import model_info
from ..runtime.hooks import model_device
from ..scoring.calibration import calibrate_on
from ..scoring.scores import LayerActivations, get_score
from .probe import FitOptions, Predictor, compare, fit_predictor, pooled_features


class _OracleWithFeatures(DynamicAblation):
    """The dynamic ablation, also pooling each row's stream entering each layer (unregistered:
    a tool of :func:`collect_oracle`)."""

    def __init__(self, score: str, threshold: float, n_inputs: int, n_layers: int, d_model: int):
        super().__init__(score, threshold)
        self.reads = tuple(self.reads) + ("resid_pre",)
        self.features: Tensor | None = None
        self.scores: Tensor | None = None
        self._shape = (n_inputs, n_layers, d_model)

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        pooled = pooled_features(acts.resid_pre, acts.valid)
        if self.features is None:
            self.features = torch.zeros(self._shape, dtype=torch.float32, device=pooled.device)
        ids = acts.sequence_ids.to(pooled.device)
        self.features[ids, acts.layer] = pooled
        values = self.score(acts)  # DynamicAblation.decide, keeping the scores
        self.check_finite(values, self.score.key, acts.layer)
        if self.scores is None:
            self.scores = torch.zeros(self._shape[:2] + (acts.n_heads,), dtype=torch.float32, device=pooled.device)
        self.scores[ids, acts.layer] = values.to(torch.float32)
        return self.score.is_inactive(values, self.threshold)


@dataclass
class OracleData:
    """Per forward input of a plan: pooled features ``[input, layer, d_model]``, the oracle's flags
    ``[input, layer, head]``, the question each input belongs to, the oracle run's result and its
    in-pass scores."""

    features: Float[Tensor, "seq n_layers d_model"]
    flags: Bool[Tensor, "seq n_layers n_heads"]
    question_keys: list[str]
    lengths: list[int]
    result: Any = field(default=None, repr=False)
    # the oracle's in-pass scores [input, layer, head] (the static set's tie-break)
    scores: Float[Tensor, "seq n_layers n_heads"] | None = field(default=None, repr=False)


def question_key(request) -> str:
    """A question's identity across plans of different ``limit`` (subject and prompt text; a
    generation request has no subject)."""
    subject = getattr(request, "subject", None)
    return hashlib.sha1(f"{subject}\x00{request.context_text}".encode()).hexdigest()[:16]


def plan_question_keys(plan) -> list[str]:
    """The question of each forward input of a multiple-choice plan, or of each generation request."""
    if _is_generation(plan):
        return [question_key(r) for r in plan]
    return [question_key(plan.requests[targets[0][0]]) for targets in plan.targets]


def _is_generation(plan) -> bool:
    return not isinstance(plan, EvalPlan)


def _prompts(requests) -> list[list[int]]:
    return [list(r.context_ids) for r in requests]


def collect_oracle(model, plan: EvalPlan, score: str, threshold: float, *, batch_size: int = 8,
                   progress: bool = False) -> OracleData:
    """Run the in-pass oracle (``DynamicAblation(score, threshold)``) on every input of ``plan``,
    collecting pooled features and flags."""
    if plan.sequence_ids is not None:
        raise UserError("collect_oracle takes a whole plan (from plan_evaluation), not a subset")
    info = model_info(model)
    oracle = _OracleWithFeatures(score, threshold, len(plan.inputs), info.n_layers, info.d_model)
    result = evaluate(model, plan, ablation=oracle, batch_size=batch_size, progress=progress)
    flags = oracle.stats.flagged_mask()
    n = len(plan.inputs)
    if flags.shape[0] != n or oracle.features is None:
        raise UserError(f"the oracle pass saw {flags.shape[0]} of {n} inputs; nothing to fit on")
    return OracleData(oracle.features.cpu(), flags, plan_question_keys(plan), [len(x) for x in plan.inputs], result,
                      oracle.scores.cpu())


def collect_oracle_prompts(model, requests, score: str, threshold: float, *, batch_size: int = 8) -> OracleData:
    """The in-pass oracle on a generation task's prompts (``requests`` from ``plan_for_task``,
    e.g. GSM8K): the pass in which ``decision="prompt"`` decides the heads it then holds; one
    input per prompt."""
    from ..evaluation.generation import decide_on_prompts

    info = model_info(model)
    prompts = _prompts(requests)
    if not prompts:
        raise UserError("no prompt to run the oracle on")
    oracle = _OracleWithFeatures(score, threshold, len(prompts), info.n_layers, info.d_model)
    flags = decide_on_prompts(model, prompts, oracle, batch_size)
    return OracleData(oracle.features.cpu(), flags, plan_question_keys(requests), [len(p) for p in prompts], None,
                      oracle.scores.cpu())


def collect_task_oracle(model, plan, score: str, threshold: float, *, batch_size: int = 8,
                        progress: bool = False) -> OracleData:
    """:func:`collect_oracle` for a multiple-choice plan (``progress``: its bar), or
    :func:`collect_oracle_prompts` for a generation task's requests (one pass over the prompts)."""
    if _is_generation(plan):
        return collect_oracle_prompts(model, plan, score, threshold, batch_size=batch_size)
    return collect_oracle(model, plan, score, threshold, batch_size=batch_size, progress=progress)


def calibrated_threshold(model, plan, score: str, p: float, *, batch_size: int = 8, progress: bool = False) -> float:
    """τ of ``score`` at quantile ``p`` from the plan's inputs (a generation task: its prompts)
    with nothing zeroed (the paper's calibration, on the fit questions only)."""
    inputs = _prompts(plan) if _is_generation(plan) else plan.inputs  # in-pass scores: the same bits
    return calibrate_on(model, inputs, score, p, batch_size=batch_size, progress=progress).at(p)


def select(data: OracleData, keep: list[bool]) -> OracleData:
    idx = torch.tensor([i for i, k in enumerate(keep) if k], dtype=torch.long)
    return OracleData(data.features[idx], data.flags[idx], [data.question_keys[i] for i in idx.tolist()],
                      [data.lengths[i] for i in idx.tolist()], None,
                      None if data.scores is None else data.scores[idx])


def fit_from_oracle(data: OracleData, *, model: str, score: str, threshold: float, lookahead: int,
                    options: FitOptions, task: str | None, p: float | None) -> Predictor:
    predictor = fit_predictor(data.features, data.flags, lookahead=lookahead, options=options, model=model,
                              score=score, threshold=threshold, task=task, p=p)
    predictor.config.fit["questions"] = sorted(set(data.question_keys))
    if data.scores is not None:  # per (layer, head): the static set's tie-break when counts tie
        predictor.config.fit["oracle_score_means"] = data.scores.double().mean(dim=0).tolist()
    return predictor


def evaluate_predictors(model, predictors: dict[str, Predictor], plan, *, batch_size: int = 8,
                        closed_loop: bool = True, baselines: bool = False,
                        max_gen_toks: int | None = None, hold_groups: float | None = None,
                        progress: bool = False, runs_file: str | Path | None = None) -> dict[str, Any]:
    """Predictors (by their saved path) against the oracle on the plan's inputs whose questions
    they were not fit on. They must share one score and threshold (one oracle).

    Teacher-forced: decisions from the features of the oracle's own pass, per layer. Closed loop
    (``closed_loop``): :class:`PredictedAblation` run as the ablation, its flags compared with the
    oracle's and both accuracies on the held-out questions. ``baselines``: also a static set of the
    oracle's held-out realized fraction (:func:`static_set`) and Random at that fraction (seed 0);
    ``static_set`` holds its heads, where its ranking came from, and its precision and recall
    against the oracle's held-out flags.

    ``plan`` is an :class:`EvalPlan` or a generation task's requests (GSM8K, from ``plan_for_task``):
    the oracle and the predictors decide on each prompt and hold their heads for every generated
    token (``decision="prompt"``, at most ``max_gen_toks`` new tokens, default 256); accuracy is
    strict exact match (``correct``), with the flexible one beside it. ``hold_groups=F`` (with
    ``closed_loop``): each predictor also runs with the group-level rule. Every closed-loop run
    reports ``kv_groups_held_fraction``. ``progress``: a line on standard error as each run starts
    and ends, and each run's own bar.

    ``runs_file``: a JSON file that gets each run's record the moment it ends, beside what the runs
    depend on (:func:`eval_identity`). A later call of the same identity takes the runs it finds
    there; a file of another identity, or not a record of runs, is refused with one line before
    anything runs, as a sweep's folder is (delete it, or ``predict eval --fresh``).
    """
    score, threshold = _one_oracle(model, predictors)
    start, shape = time.perf_counter(), _model_shape(model)

    def say(text: str) -> None:
        if progress:
            print(f"predict eval: {text} [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    fit_questions = set().union(*(set(p.config.fit.get("questions", ())) for p in predictors.values()))
    saved_fit = next((p.config.fit for p in predictors.values() if "oracle_flag_counts" in p.config.fit), None)
    if baselines and saved_fit is None and fit_questions.isdisjoint(plan_question_keys(plan)):
        raise UserError("the static set of --baselines ranks heads by the oracle's flags on the fit questions, "
                        "which this plan does not hold (other subjects?) and the predictor does not save (fit "
                        "before it did); fit it again with predict fit, or drop --baselines")
    identity = eval_identity(model, predictors, plan_question_keys(plan), _input_lengths(plan), score=score,
                             threshold=threshold, max_gen_toks=max_gen_toks, hold_groups=hold_groups)
    runs = _Runs(None if runs_file is None else Path(runs_file), identity, say)
    say(f"the oracle's pass for its flags and features ({len(_input_lengths(plan))} inputs)")
    data = collect_task_oracle(model, plan, score, threshold, batch_size=batch_size, progress=progress)
    keep = [k not in fit_questions for k in data.question_keys]
    if not any(keep):
        raise UserError("every question of this plan was used to fit the predictor; evaluate on others "
                        "(a larger --limit: the first questions are the fit's)")
    held = select(data, keep)
    runs.heldout = _Heldout(model, plan, [i for i, k in enumerate(keep) if k], batch_size=batch_size,
                            max_gen_toks=max_gen_toks, progress=progress)
    in_plan = fit_questions & set(data.question_keys)
    out: dict[str, Any] = {
        "score": score, "threshold": threshold, "task": plan[0].task if _is_generation(plan) else plan.task,
        "n_heldout_sequences": len(held.lengths), "n_heldout_questions": len(set(held.question_keys)),
        "n_fit_questions_in_plan": len(in_plan), "predictors": {},
        **({"decision": "prompt"} if _is_generation(plan) else {}),
    }
    accuracy: dict[str, Any] = {}
    if closed_loop:
        accuracy["oracle"] = runs.run("oracle", DynamicAblation(score, threshold))["summary"]
    for path, predictor in predictors.items():
        out["predictors"][path] = _predictor_entry(model, path, predictor, held, runs, accuracy, shape,
                                                   closed_loop=closed_loop, hold_groups=hold_groups)
    if baselines:
        out["static_set"], heads = static_set(model, data, keep, score, saved_fit if in_plan != fit_questions else None,
                                              in_plan=len(in_plan), n_fit=len(fit_questions))
        fraction = float(held.flags.double().mean())
        accuracy["static"] = runs.run("static", StaticAblation(heads), heads=out["static_set"]["heads"])["summary"]
        accuracy["random"] = runs.run("random", RandomAblation(fraction, seed=0))["summary"]
        accuracy["none"] = runs.run("none", None)["summary"]
    out["accuracy"] = accuracy
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _predictor_entry(model, path: str, predictor: Predictor, held: OracleData, runs: "_Runs", accuracy: dict,
                     shape, *, closed_loop: bool, hold_groups: float | None) -> dict[str, Any]:
    """One predictor's entry of ``eval.json``; its closed-loop runs' accuracies go to ``accuracy``."""
    from .ablation import PredictedAblation

    entry: dict[str, Any] = {
        "lookahead": predictor.lookahead, "rank": predictor.config.rank,
        "teacher_forced": compare(predictor.predict(held.features), held.flags).to_dict(),
        "cost_fraction": cost_fraction(model, predictor, held.lengths),
    }
    if closed_loop:
        name = f"predicted_lookahead{predictor.lookahead}"
        record = runs.run(name, PredictedAblation(path), runs.closed_loop_details(held.flags, shape))
        accuracy[name], entry["closed_loop"] = record["summary"], record["closed_loop"]
        if hold_groups is not None:
            record = runs.run(f"{name}_groups", PredictedAblation(path, hold_groups=hold_groups),
                              runs.group_details(hold_groups, shape))
            accuracy[f"{name}_groups"], entry["group_level"] = record["summary"], record["group_level"]
    return entry


def _one_oracle(model, predictors: dict[str, Predictor]) -> tuple[str, float]:
    """The one (score, τ) the predictors share, after checking each fits the model."""
    if not predictors:
        raise UserError("no predictor to evaluate")
    configs = {(p.config.score, p.config.threshold) for p in predictors.values()}
    if len(configs) != 1:
        raise UserError(f"predictors of different oracles {sorted(configs)}; evaluate them one at a time")
    info = model_info(model)
    for predictor in predictors.values():
        predictor.check_model(info.n_layers, info.n_heads, info.d_model, f"model {info.name!r}")
    return next(iter(configs))


def _model_shape(model):
    from ..pruning.accountant import model_shape

    return model_shape(model)


def _input_lengths(plan) -> list[int]:
    """The token count of each oracle input: a plan's forward inputs, or a generation task's prompts."""
    return [len(p) for p in _prompts(plan)] if _is_generation(plan) else [len(x) for x in plan.inputs]


class _Heldout:
    """The held-out questions' runs: ``evaluated(ablation)`` and ``flags(ablation)``, each input's
    flags in held-out order."""

    def __init__(self, model, plan, kept: list[int], *, batch_size: int, max_gen_toks: int | None, progress: bool):
        self.model, self.batch_size, self.progress, self.max_gen_toks = model, batch_size, progress, max_gen_toks
        self.generation = _is_generation(plan)
        self.requests = [plan[i] for i in kept] if self.generation else None
        self.plan = None if self.generation else plan.subset(kept)

    def evaluated(self, ablation):
        if self.generation:
            from ..evaluation.generation import evaluate_generation

            return evaluate_generation(self.model, self.requests[0].task, ablation=ablation, decision="prompt",
                                       requests=self.requests, max_gen_toks=self.max_gen_toks,
                                       batch_size=self.batch_size, progress=self.progress)
        exact = {"attention": "exact"} if ablation is None else {}  # the exact attention the ablated runs use
        return evaluate(self.model, self.plan, ablation=ablation, batch_size=self.batch_size, progress=self.progress,
                        **exact)

    def flags(self, abl) -> Tensor:
        if self.generation:  # held-out prompts have the ids 0..n-1
            return abl.stats.flagged_mask(n=len(self.requests))
        return abl.stats.flagged_mask()[self.plan.sequence_ids]


class _Runs:
    """Each run of an eval, taken from the runs file when it finished there, else run and recorded."""

    def __init__(self, runs_file: Path | None, identity: dict[str, Any], say: Callable[[str], None]):
        self.runs_file, self.identity, self.say = runs_file, identity, say
        self.finished = _finished_runs(runs_file, identity) if runs_file is not None else {}
        self.heldout: _Heldout | None = None

    def run(self, name: str, ablation, details: Callable[[Any], dict[str, Any]] | None = None,
            heads: list[list[int]] | None = None) -> dict[str, Any]:
        """The run's record: ``summary`` (its accuracy), what ``details`` reads off the ablation, and
        ``heads`` (a fixed set's (layer, head) pairs: a finished run of another set is run again)."""
        if name in self.finished and self.finished[name].get("heads") == heads:
            record = self.finished[name]
            self.say(f"{name}: accuracy {100 * record['summary']['accuracy']:.1f} % (finished earlier: "
                     f"{self.runs_file})")
            return record
        self.say(f"running {name}")
        record = {"summary": _run_summary(self.heldout.evaluated(ablation))}
        if heads is not None:
            record["heads"] = heads
        if details is not None:
            record.update(details(ablation))
        self.say(f"{name}: accuracy {100 * record['summary']['accuracy']:.1f} %")
        if self.runs_file is not None:
            self.finished[name] = record
            write_json_atomic(self.runs_file, {"format": RUNS_FORMAT, "identity": self.identity,
                                               "runs": self.finished})
        return record

    def closed_loop_details(self, oracle_flags: Tensor, shape) -> Callable[[Any], dict[str, Any]]:
        from ..pruning.accountant import held_fractions

        def details(abl) -> dict[str, Any]:
            flags = self.heldout.flags(abl)
            return {"closed_loop": {**compare(flags, oracle_flags).to_dict(),
                                    "kv_groups_held_fraction": held_fractions(shape, flags)["kv_groups"]}}
        return details

    def group_details(self, hold_groups: float, shape) -> Callable[[Any], dict[str, Any]]:
        from ..pruning.accountant import held_fractions

        def details(abl) -> dict[str, Any]:
            return {"group_level": {"hold_groups": hold_groups, "kv_groups_held_fraction":
                                    held_fractions(shape, self.heldout.flags(abl))["kv_groups"]}}
        return details


def static_set(model, data: OracleData, keep: list[bool], score: str, saved_fit: dict[str, Any] | None, *,
               in_plan: int, n_fit: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The static baseline of an eval: the oracle's held-out realized fraction of heads, ranked by
    :func:`~inactive_heads.pruning.static.static_heads`' rule (``flag_rate``): most often flagged
    by the oracle on the fit questions first, ties by the more inactive mean of the oracle's in-pass
    score there, then by (layer, head). Counted in this pass when the plan holds every fit question
    (``saved_fit`` None), else from what the fit saved (``saved_fit``: a predictor's ``fit``).
    Returns ``eval.json``'s ``static_set`` and the heads."""
    from ..pruning.skipping import held_mask
    from ..pruning.static import inactive_order

    held, fit = select(data, keep), select(data, [not k for k in keep])
    n_heads = data.flags.shape[2]
    if saved_fit is not None:
        counts, counted = torch.tensor(saved_fit["oracle_flag_counts"]).flatten(), "the fit's saved counts"
        means = saved_fit.get("oracle_score_means")
        means = None if means is None else torch.tensor(means, dtype=torch.float64).flatten()
    else:
        counts, means = fit.flags.sum(dim=0).flatten(), fit.scores.double().mean(dim=0).flatten()
        counted = "this plan's fit questions" if in_plan == n_fit else f"this plan's {in_plan} of the {n_fit} fit questions"
    if means is None:  # a predictor saved before the means were: ties by (layer, head)
        means, counted = torch.zeros(counts.numel(), dtype=torch.float64), f"{counted} (ties by layer and head)"
    inactive_first = means if get_score(score).direction == "below" else -means
    k = int(round(float(held.flags.double().mean()) * counts.numel()))
    top = inactive_order(-counts.double(), inactive_first)[:k].tolist()
    heads = [(i // n_heads, i % n_heads) for i in top]
    # the per-input decision's yardstick: the same heads on every input, against the oracle
    return ({"n_heads": len(heads), "heads": [list(h) for h in heads], "ranked_by": counted,
             "vs_oracle": compare(held_mask(model, heads, held.flags.shape[0]), held.flags).to_dict()}, heads)


RUNS_FORMAT = 1


def eval_identity(model, predictors: dict[str, Predictor], question_keys: list[str], lengths: list[int], *,
                  score: str, threshold: float, max_gen_toks: int | None, hold_groups: float | None) -> dict[str, Any]:
    """What :func:`evaluate_predictors`' runs depend on, as plain JSON: the model (name, dtype,
    device type), the oracle (score, τ), the inputs (a digest of their questions and token
    counts), each predictor (a digest of its weights and decision threshold) and the options that
    change a run (``max_gen_toks``, ``hold_groups``). The batch size is left out: results do not
    depend on it."""
    def digest(*parts: bytes) -> str:
        h = hashlib.sha256()
        for part in parts:
            h.update(len(part).to_bytes(8, "little") + part)
        return h.hexdigest()

    weights = {path: digest(*(t.detach().cpu().contiguous().numpy().tobytes()
                              for t in (p.mean, p.scale, p.down, p.up, p.bias)),
                            repr((p.config.decision_threshold, p.lookahead)).encode())
               for path, p in predictors.items()}
    info = model_info(model)
    return {"model": info.name, "dtype": str(info.dtype), "device": model_device(model).type,
            "score": score, "threshold": threshold,
            "inputs": digest(json.dumps([question_keys, lengths]).encode()),
            "predictors": weights, "max_gen_toks": max_gen_toks, "hold_groups": hold_groups}


def _finished_runs(path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The runs recorded in ``path`` for this ``identity``: none when the file is absent; a file of
    another identity (or format), or one that is not a record of runs, is refused with one line
    (:func:`~inactive_heads.core.resume.check_same_setup`, the sweep folder's rule)."""
    fix = "delete it or run predict eval with --fresh (which replaces it), or use another folder"
    if not path.is_file():
        return {}
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        runs, theirs = stored["runs"], stored["identity"]
        if not isinstance(runs, dict) or not isinstance(theirs, dict):
            raise TypeError("its runs or identity is not a mapping")
        version = stored["format"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise UserError(f"'{path}' is not a record of finished predict eval runs ({type(err).__name__}: {err}); "
                        f"{fix}") from None
    check_same_setup(path, {"format": version, **theirs}, {"format": RUNS_FORMAT, **identity},
                     what="predict evaluation", fix=fix)
    return dict(runs)


def _run_summary(result) -> dict[str, Any]:
    summary = {"accuracy": result.accuracy, "realized_fraction": result.realized_fraction, "correct": result.correct}
    if hasattr(result, "correct_flexible"):  # a generation task: the flexible filter's answers beside the strict
        summary.update(accuracy_flexible=result.accuracy_flexible, correct_flexible=result.correct_flexible,
                       n_generated_tokens=result.n_generated_tokens)
    return summary


def cost_fraction(model, predictor: Predictor, lengths: list[int]) -> dict[str, Any]:
    """The probe's multiply-adds per sequence and layer as a fraction of the layer's (FLOP model),
    at the mean and the shortest sequence length of these inputs (short sequences cost most)."""
    from ..pruning.accountant import model_shape

    shape = model_shape(model)
    mean_len = round(sum(lengths) / len(lengths))
    return {"mean_seq_len": mean_len, "at_mean_len": predictor.cost_fraction(shape, mean_len),
            "min_seq_len": min(lengths), "at_min_len": predictor.cost_fraction(shape, min(lengths))}
