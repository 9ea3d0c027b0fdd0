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
from ..evaluation.evaluator import evaluate
from ..evaluation.plan import EvalPlan
from ..models.loading import model_info
from ..runtime.hooks import model_device
from ..scoring.calibration import calibrate_on
from ..scoring.scores import LayerActivations
from .probe import FitOptions, Predictor, compare, fit_predictor, pooled_features


class _OracleWithFeatures(DynamicAblation):
    """The dynamic ablation, also pooling each row's stream entering each layer (unregistered:
    a tool of :func:`collect_oracle`)."""

    def __init__(self, score: str, threshold: float, n_inputs: int, n_layers: int, d_model: int):
        super().__init__(score, threshold)
        self.reads = tuple(self.reads) + ("resid_pre",)
        self.features: Tensor | None = None
        self._shape = (n_inputs, n_layers, d_model)

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        pooled = pooled_features(acts.resid_pre, acts.valid)
        if self.features is None:
            self.features = torch.zeros(self._shape, dtype=torch.float32, device=pooled.device)
        self.features[acts.sequence_ids.to(pooled.device), acts.layer] = pooled
        return super().decide(acts)


@dataclass
class OracleData:
    """Per forward input of a plan: pooled features ``[input, layer, d_model]``, the oracle's flags
    ``[input, layer, head]``, the question each input belongs to, and the oracle run's result."""

    features: Float[Tensor, "seq n_layers d_model"]
    flags: Bool[Tensor, "seq n_layers n_heads"]
    question_keys: list[str]
    lengths: list[int]
    result: Any = field(default=None, repr=False)


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
    return OracleData(oracle.features.cpu(), flags, plan_question_keys(plan), [len(x) for x in plan.inputs], result)


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
    return OracleData(oracle.features.cpu(), flags, plan_question_keys(requests), [len(p) for p in prompts], None)


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
                      [data.lengths[i] for i in idx.tolist()], None)


def fit_from_oracle(data: OracleData, *, model: str, score: str, threshold: float, lookahead: int,
                    options: FitOptions, task: str | None, p: float | None) -> Predictor:
    predictor = fit_predictor(data.features, data.flags, lookahead=lookahead, options=options, model=model,
                              score=score, threshold=threshold, task=task, p=p)
    predictor.config.fit["questions"] = sorted(set(data.question_keys))
    return predictor


def evaluate_predictors(model, predictors: dict[str, Predictor], plan, *, batch_size: int = 8,
                        closed_loop: bool = True, baselines: bool = False,
                        max_gen_toks: int | None = None, hold_groups: float | None = None,
                        progress: bool = False, runs_file: str | Path | None = None) -> dict[str, Any]:
    """Predictors (by their saved path) against the oracle on the plan's inputs whose questions
    they were not fit on. They must share one score and threshold (one oracle).

    Teacher-forced: decisions from the features of the oracle's own pass, per layer (what each
    probe was fit to do). Closed loop (``closed_loop``): :class:`PredictedAblation` run as the
    ablation — the stream it reads reflects its own earlier zeroing — with its flags compared with
    the oracle's and both accuracies on the held-out questions. ``baselines``: also a static set of
    the oracle's held-out realized fraction — the (layer, head) pairs the oracle flags most often on
    the fit questions, counted in this pass when the plan holds all of them, else as the fit saved
    them — and Random at that fraction (seed 0); ``static_set`` holds that set's heads, where its
    ranking came from, and its own precision and recall against the oracle's held-out flags, the
    yardstick a per-input decision has to beat.

    ``plan`` is an :class:`EvalPlan` or a generation task's requests (GSM8K, from ``plan_for_task``).
    For the latter the oracle and the predictors decide on each prompt and hold their heads for
    every generated token (``decision="prompt"``, at most ``max_gen_toks`` new tokens, default
    256); accuracy is strict exact match (``correct``), with the flexible one beside it.

    ``hold_groups=F`` (with ``closed_loop``): each predictor also runs with the group-level rule
    (``PredictedAblation(path, hold_groups=F)``), its accuracy beside the others'. Every closed-loop
    run reports ``kv_groups_held_fraction``: the share of (sequence, layer, KV group) whose query
    heads are all held, the KV heads a real skip frees.

    ``progress``: a line on standard error as each run starts and ends (with its accuracy and the
    time so far), and each run's own bar.

    ``runs_file``: a JSON file that gets each run's record, written atomically the moment the run
    ends, beside what the runs depend on (:func:`eval_identity`). A later call whose identity is
    the same takes the runs it finds there instead of running them again (after the oracle's
    pass, which the comparisons need), so an evaluation that was stopped resumes with at most the
    run in progress lost, and adding ``baselines`` or ``hold_groups`` later runs only what is new.
    A file from another setup is said on standard error and replaced.
    """
    from ..pruning.accountant import held_fractions, model_shape
    from ..pruning.skipping import held_mask
    from .ablation import PredictedAblation

    if not predictors:
        raise UserError("no predictor to evaluate")
    configs = {(p.config.score, p.config.threshold) for p in predictors.values()}
    if len(configs) != 1:
        raise UserError(f"predictors of different oracles {sorted(configs)}; evaluate them one at a time")
    (score, threshold), = configs
    info, shape = model_info(model), model_shape(model)
    for path, predictor in predictors.items():
        predictor.check_model(info.n_layers, info.n_heads, info.d_model, f"model {info.name!r}")
    start = time.perf_counter()

    def say(text: str) -> None:
        if progress:
            print(f"predict eval: {text} [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    fit_questions = set().union(*(set(p.config.fit.get("questions", ())) for p in predictors.values()))
    saved_counts = next((p.config.fit["oracle_flag_counts"] for p in predictors.values()
                         if "oracle_flag_counts" in p.config.fit), None)
    if baselines and saved_counts is None and fit_questions.isdisjoint(plan_question_keys(plan)):
        raise UserError("the static set of --baselines ranks heads by the oracle's flags on the fit questions, "
                        "which this plan does not hold (other subjects?) and the predictor does not save (fit "
                        "before it did); fit it again with predict fit, or drop --baselines")
    say(f"the oracle's pass for its flags and features ({len(plan) if _is_generation(plan) else len(plan.inputs)} "
        "inputs)")
    data = collect_task_oracle(model, plan, score, threshold, batch_size=batch_size, progress=progress)
    keep = [k not in fit_questions for k in data.question_keys]
    in_plan = fit_questions & set(data.question_keys)
    if not any(keep):
        raise UserError("every question of this plan was used to fit the predictor; evaluate on others "
                        "(a larger --limit: the first questions are the fit's)")
    held = select(data, keep)
    kept = [i for i, k in enumerate(keep) if k]
    if _is_generation(plan):
        from ..evaluation.generation import evaluate_generation

        heldout = [plan[i] for i in kept]

        def evaluated(ablation):
            return evaluate_generation(model, heldout[0].task, ablation=ablation, decision="prompt", requests=heldout,
                                       max_gen_toks=max_gen_toks, batch_size=batch_size, progress=progress)

        def loop_flags(abl) -> Tensor:  # each held-out prompt's flags, in held-out order (ids 0..n-1)
            return abl.stats.flagged_mask(n=len(heldout))
    else:
        heldout_plan = plan.subset(kept)

        def evaluated(ablation):  # nothing zeroed: the same exact attention the ablated runs use
            exact = {"attention": "exact"} if ablation is None else {}
            return evaluate(model, heldout_plan, ablation=ablation, batch_size=batch_size, progress=progress,
                            **exact)

        def loop_flags(abl) -> Tensor:
            return abl.stats.flagged_mask()[heldout_plan.sequence_ids]

    identity = eval_identity(model, predictors, data, score=score, threshold=threshold, max_gen_toks=max_gen_toks,
                             hold_groups=hold_groups)
    runs_file = None if runs_file is None else Path(runs_file)
    finished = _finished_runs(runs_file, identity) if runs_file is not None else {}

    def run(name: str, ablation, details: Callable[[Any], dict[str, Any]] | None = None,
            heads: list[list[int]] | None = None) -> dict[str, Any]:
        """The run's record: ``summary`` (its accuracy), what ``details`` reads off the ablation, and
        ``heads`` (a fixed set's (layer, head) pairs: a finished run of another set is run again)."""
        if name in finished and finished[name].get("heads") == heads:
            record = finished[name]
            say(f"{name}: accuracy {100 * record['summary']['accuracy']:.1f} % (finished earlier: {runs_file})")
            return record
        say(f"running {name}")
        record = {"summary": _run_summary(evaluated(ablation))}
        if heads is not None:
            record["heads"] = heads
        if details is not None:
            record.update(details(ablation))
        say(f"{name}: accuracy {100 * record['summary']['accuracy']:.1f} %")
        if runs_file is not None:
            finished[name] = record
            write_json_atomic(runs_file, {"format": RUNS_FORMAT, "identity": identity, "runs": finished})
        return record

    out: dict[str, Any] = {
        "score": score, "threshold": threshold, "task": plan[0].task if _is_generation(plan) else plan.task,
        "n_heldout_sequences": len(held.lengths), "n_heldout_questions": len(set(held.question_keys)),
        "n_fit_questions_in_plan": len(in_plan), "predictors": {},
    }
    if _is_generation(plan):
        out["decision"] = "prompt"
    accuracy: dict[str, Any] = {}
    if closed_loop:
        accuracy["oracle"] = run("oracle", DynamicAblation(score, threshold))["summary"]

    def closed_loop_details(abl) -> dict[str, Any]:
        flags = loop_flags(abl)
        return {"closed_loop": {**compare(flags, held.flags).to_dict(),
                                "kv_groups_held_fraction": held_fractions(shape, flags)["kv_groups"]}}

    def group_details(abl) -> dict[str, Any]:
        return {"group_level": {"hold_groups": hold_groups,
                                "kv_groups_held_fraction": held_fractions(shape, loop_flags(abl))["kv_groups"]}}

    for path, predictor in predictors.items():
        entry: dict[str, Any] = {
            "lookahead": predictor.lookahead, "rank": predictor.config.rank,
            "teacher_forced": compare(predictor.predict(held.features), held.flags).to_dict(),
            "cost_fraction": cost_fraction(model, predictor, held.lengths),
        }
        if closed_loop:
            name = f"predicted_lookahead{predictor.lookahead}"
            record = run(name, PredictedAblation(path), closed_loop_details)
            accuracy[name], entry["closed_loop"] = record["summary"], record["closed_loop"]
            if hold_groups is not None:
                record = run(f"{name}_groups", PredictedAblation(path, hold_groups=hold_groups), group_details)
                accuracy[f"{name}_groups"], entry["group_level"] = record["summary"], record["group_level"]
        out["predictors"][path] = entry
    if baselines:
        fraction = float(held.flags.double().mean())
        fit_part = [not k for k in keep]
        # ranked by the oracle's flags on the fit questions: from this plan's pass where it holds all
        # of them, else as the fit saved them (a split by subject, whole or in part), else from the
        # part this plan holds (a predictor saved before the counts were)
        if saved_counts is not None and in_plan != fit_questions:
            counts, counted = torch.tensor(saved_counts).flatten(), "the fit's saved counts"
        else:
            counts = select(data, fit_part).flags.sum(dim=0).flatten()
            counted = ("this plan's fit questions" if in_plan == fit_questions
                       else f"this plan's {len(in_plan)} of the {len(fit_questions)} fit questions")
        k = int(round(fraction * counts.numel()))
        top = counts.argsort(descending=True, stable=True)[:k].tolist()
        heads = [(i // info.n_heads, i % info.n_heads) for i in top]
        listed = [list(h) for h in heads]  # as JSON keeps them: compared with a finished run's on resume
        # the per-input decision's yardstick: the same heads on every input, against the oracle
        out["static_set"] = {"n_heads": len(heads), "heads": listed, "ranked_by": counted,
                             "vs_oracle": compare(held_mask(model, heads, held.flags.shape[0]), held.flags).to_dict()}
        accuracy["static"] = run("static", StaticAblation(heads), heads=listed)["summary"]
        accuracy["random"] = run("random", RandomAblation(fraction, seed=0))["summary"]
        accuracy["none"] = run("none", None)["summary"]
    out["accuracy"] = accuracy
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


RUNS_FORMAT = 1


def eval_identity(model, predictors: dict[str, Predictor], data: OracleData, *, score: str, threshold: float,
                  max_gen_toks: int | None, hold_groups: float | None) -> dict[str, Any]:
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
            "inputs": digest(json.dumps([data.question_keys, data.lengths]).encode()),
            "predictors": weights, "max_gen_toks": max_gen_toks, "hold_groups": hold_groups}


def _finished_runs(path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The runs recorded in ``path`` for this ``identity`` (none when the file is absent, unreadable
    or of another setup; the last two are said on standard error, with or without progress)."""
    def say(text: str) -> None:
        print(f"predict eval: {text}", file=sys.stderr, flush=True)

    if not path.is_file():
        return {}
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        runs, theirs = stored["runs"], stored["identity"]
        if not isinstance(runs, dict) or not isinstance(theirs, dict):
            raise TypeError("its runs or identity is not a mapping")
        same = theirs == identity and stored["format"] == RUNS_FORMAT
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        say(f"{path} is not a record of finished runs ({type(err).__name__}: {err}); running every run, "
            "and replacing it")
        return {}
    if not same:
        differ = sorted(k for k in identity if theirs.get(k) != identity[k]) or ["format"]
        say(f"{path} holds runs of another setup (it differs in {', '.join(differ)}); running every run, "
            "and replacing it")
        return {}
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
