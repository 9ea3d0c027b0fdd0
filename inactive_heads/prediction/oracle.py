"""The training data of a predictor: one in-pass oracle run (the paper's dynamic ablation) over a
task's inputs, keeping per (sequence, layer) the pooled residual stream entering the layer and
the oracle's flags; splitting by question; fitting (:mod:`~inactive_heads.prediction.heldout`
evaluates the fits on held-out questions).

A multiple-choice task's inputs are its plan's forward inputs; a generation task's (GSM8K) are its
prompts, where the oracle decides once and holds the heads for every generated token
(``decision="prompt"``), so the predictor is fit and checked on that same prompt pass.

The features come from the oracle's own pass: the stream entering layer ``l`` already reflects the
oracle's zeroing in layers before ``l`` (the cascade), as a predictor running in place of the
oracle would see its own. Each feature is reduced inside the layer's hook (pooled to
``[batch, d_model]``); no ``[batch, pos, d_model]`` tensor outlives its layer.
"""

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..ablation.head_ablation import DynamicAblation
from ..core.errors import UserError
from ..evaluation.evaluator import evaluate
from ..evaluation.plan import EvalPlan
from ..models.loading import model_info
from ..scoring.calibration import calibrate_on
from ..scoring.scores import LayerActivations
from .probe import FitOptions, Predictor, fit_predictor, pooled_features


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
