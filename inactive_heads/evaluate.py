"""Evaluate a model — plain or with heads zeroed — on MMLU, PIQA or WinoGrande as lm-eval 0.4.5 does.

Scoring is by log-likelihood of each answer's continuation. As in lm-eval, requests whose model
input (context + continuation minus its last token) is identical share one forward pass: for
MMLU that is one pass per question, ending at "Answer:", scoring " A".." D" at its last position.
Those forward inputs are the "sequences" on which dynamic ablation decides what to zero, and the
denominator of the realized fraction zeroed.
"""

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from .ablation import AblationSpec, HeadAblation
from .hooks import HeadHookRunner, make_batches, model_device
from .models import model_info
from .recording import ScoreRecorder, scores_metadata, toolkit_version
from .scores import resolve_scores
from .tasks import TASKS, Request, build_requests


@dataclass
class EvalPlan:
    """Requests of one task, tokenized once, with their unique forward inputs.

    ``inputs[i]`` is a token list; ``targets[i]`` lists, for that input, the
    ``(request, choice, first position, continuation tokens)`` it scores. ``n_truncated`` counts
    the requests (questions) with at least one choice left-truncated to the model context.
    """

    task: str
    requests: list[Request]
    inputs: list[list[int]]
    targets: list[list[tuple[int, int, int, tuple[int, ...]]]]
    config: dict[str, Any]
    n_truncated: int = 0
    # A part of a larger plan (see :meth:`subset`): the global ids of its inputs and requests.
    sequence_ids: list[int] | None = None
    request_ids: list[int] | None = None

    @property
    def n_requests(self) -> int:
        return len(self.requests)

    def global_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Sequence ids of ``inputs[indices]`` in the whole plan (the ids Random draws are seeded by)."""
        if self.sequence_ids is None:
            return indices
        return torch.tensor([self.sequence_ids[i] for i in indices.tolist()], dtype=torch.long)

    def subset(self, input_indices: Sequence[int]) -> "EvalPlan":
        """The plan restricted to some inputs (a shard), keeping their global sequence and request
        ids; requests are those the inputs score (a request may be split across shards)."""
        requests, request_ids, where = [], [], {}
        targets = []
        for i in input_indices:
            mine = []
            for r, c, first, cont in self.targets[i]:
                if r not in where:
                    where[r] = len(requests)
                    requests.append(self.requests[r])
                    request_ids.append(r if self.request_ids is None else self.request_ids[r])
                mine.append((where[r], c, first, cont))
            targets.append(mine)
        ids = [i if self.sequence_ids is None else self.sequence_ids[i] for i in input_indices]
        return EvalPlan(self.task, requests, [self.inputs[i] for i in input_indices], targets, dict(self.config),
                        n_truncated=0, sequence_ids=ids, request_ids=request_ids)


def plan_evaluation(
    model,
    task: str,
    *,
    subjects: Sequence[str] | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool | None = None,
    source: str | None = None,
) -> EvalPlan:
    """Build and tokenize a task's requests once (reuse the plan across many ablated runs).

    A request longer than the model context is left-truncated as lm-eval 0.4.5 does: the model
    input is the last ``n_ctx + 1`` tokens of context + continuation, minus the last token, and the
    continuation is scored at the input's last positions. Requests whose untruncated inputs are
    equal share one forward pass (lm-eval groups them the same way).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task '{task}'; known: {', '.join(TASKS)}")
    info = model_info(model)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    requests = build_requests(
        task,
        model.tokenizer,
        subjects=subjects,
        limit=limit,
        num_fewshot=num_fewshot,
        apply_chat_template=chat,
        prepend_bos=info.prepend_bos,
        source=source,
    )
    index: dict[tuple[int, ...], int] = {}
    inputs: list[list[int]] = []
    targets: list[list[tuple[int, int, int, tuple[int, ...]]]] = []
    truncated: set[int] = set()
    for r, req in enumerate(requests):
        for c, choice in enumerate(req.choices):
            if not choice.context_ids or not choice.continuation_ids:
                raise ValueError(f"{task} request {req.doc_id} choice {c} has an empty context or continuation")
            cont = tuple(choice.continuation_ids)
            if len(cont) > info.n_ctx:
                raise ValueError(
                    f"{task} request {req.doc_id} choice {c} has a {len(cont)}-token answer, longer than the "
                    f"model context {info.n_ctx}; load the model with a larger n_ctx"
                )
            whole = tuple(choice.context_ids) + cont
            key = whole[:-1]
            i = index.get(key)
            if i is None:
                i = index[key] = len(inputs)
                # lm-eval 0.4.5: keep the last n_ctx + 1 tokens, feed all but the last one.
                inputs.append(list(whole[-(info.n_ctx + 1):][:-1]))
                targets.append([])
            if len(key) > info.n_ctx:
                truncated.add(r)
            targets[i].append((r, c, len(inputs[i]) - len(cont), cont))
    config = {
        "model": info.name,
        "task": task,
        "subjects": list(subjects) if subjects is not None else None,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "apply_chat_template": chat,
        "prepend_bos": info.prepend_bos,
        "source": source,
    }
    return EvalPlan(task, requests, inputs, targets, config, n_truncated=len(truncated))


@dataclass
class EvalResult:
    """Accuracy and everything needed to trust it: per-question outcomes, realized zeroing, config."""

    task: str
    accuracy: float
    n: int
    correct: list[bool]
    loglikelihoods: list[list[float]]
    acc_norm: float | None = None
    correct_norm: list[bool] | None = None
    per_subject: dict[str, dict[str, float]] = field(default_factory=dict)
    realized_fraction: float = 0.0
    realized_fraction_per_layer: list[float] = field(default_factory=list)
    n_forward_sequences: int = 0
    n_truncated: int = 0  # questions left-truncated to the model context (as lm-eval 0.4.5 does)
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # HeadScores recorded in this pass (``evaluate(..., record=[...])``); not part of to_dict().
    head_scores: Any = field(default=None, repr=False, compare=False)

    @property
    def accuracy_percent(self) -> float:
        return 100.0 * self.accuracy

    @property
    def questions_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("head_scores")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        return cls(**d)

    def __repr__(self) -> str:
        zeroed = f", {100 * self.realized_fraction:.2f}% heads zeroed" if self.realized_fraction else ""
        return f"EvalResult({self.task}: accuracy {100 * self.accuracy:.2f}% on n={self.n}{zeroed})"


def _as_ablation(ablation) -> HeadAblation | None:
    if ablation is None or isinstance(ablation, HeadAblation):
        return ablation
    if isinstance(ablation, AblationSpec):
        return ablation.build()
    if isinstance(ablation, dict):
        return AblationSpec.from_dict(ablation).build()
    raise TypeError(
        f"ablation must be None, a HeadAblation (StaticAblation/DynamicAblation/RandomAblation) "
        f"or an AblationSpec, got {type(ablation).__name__}"
    )


def _logits_at(model, tokens, valid, rows, positions):
    """Logits at (row, position) pairs only: the unembedding runs on those rows, not the batch."""
    mask = valid.long()
    cfg = model.cfg
    if hasattr(model, "unembed") and type(model).__name__ == "HookedTransformer":
        resid = model(tokens, attention_mask=mask, stop_at_layer=cfg.n_layers)
        x = resid[rows, positions][:, None, :]
        logits = model.unembed(model.ln_final(x))[:, 0, :]
        cap = getattr(cfg, "output_logits_soft_cap", -1.0)
        if cap and cap > 0:
            logits = cap * torch.tanh(logits / cap)
        return logits
    return model(tokens, attention_mask=mask)[rows, positions]


def evaluate(
    model,
    task: str | EvalPlan,
    *,
    ablation=None,
    subjects: Sequence[str] | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool | None = None,
    batch_size: int = 8,
    progress: bool = True,
    source: str | None = None,
    record: Sequence[str] | None = None,
    record_description: str | None = None,
) -> EvalResult:
    """Accuracy of ``model`` on a task, optionally with heads zeroed by ``ablation``.

    >>> res = evaluate(model, "mmlu", subjects=["anatomy"], limit=20)             # doctest: +SKIP
    >>> res = evaluate(model, "mmlu", subjects=["anatomy"], limit=20,
    ...                ablation=DynamicAblation("ahon_ln", 0.4))                  # doctest: +SKIP
    >>> res.accuracy, res.realized_fraction                                       # doctest: +SKIP

    ``task`` is "mmlu", "piqa" or "winogrande" (or an :class:`EvalPlan` from
    :func:`plan_evaluation`, to tokenize once for many runs). ``apply_chat_template=None`` follows
    the paper: on for chat/instruct models. ``limit`` = first N questions (of each MMLU subject).
    Batches are length-sorted and right-padded with an attention mask; pads never reach real
    tokens, so results do not depend on ``batch_size``. ``record`` = score keys to record in the
    same pass (``result.head_scores``, as :func:`record_scores` would on ``plan.inputs``).
    """
    if isinstance(task, EvalPlan):
        plan = task
    else:
        plan = plan_evaluation(
            model,
            task,
            subjects=subjects,
            limit=limit,
            num_fewshot=num_fewshot,
            apply_chat_template=apply_chat_template,
            source=source,
        )
    abl = _as_ablation(ablation)
    info = model_info(model)
    device = model_device(model)
    lls = [[0.0] * len(req.choices) for req in plan.requests]
    bar = tqdm(total=len(plan.inputs), desc=f"{plan.task}" + (f" [{abl.spec.name}]" if abl else ""),
               unit="seq", disable=not progress, leave=False)
    start = time.perf_counter()
    hooks = []
    runners = []
    if abl is not None:
        abl.reset(model)
        runners.append(abl.runner(model))
    recorder = None
    if record:
        if abl is not None:
            raise ValueError("record= records scores of the unablated model; pass it without ablation")
        recorder = ScoreRecorder(resolve_scores(list(record)), len(plan.inputs), info.n_layers, info.n_heads,
                                 sequence_ids=plan.sequence_ids)
        runners.append(HeadHookRunner(model, recorder.on_layer, reads=recorder.reads))
    for runner in runners:
        hooks += runner.fwd_hooks()
    with model.hooks(fwd_hooks=hooks), torch.inference_mode():
        for batch in make_batches(plan.inputs, batch_size, device=device):
            for runner in runners:
                runner.set_batch(batch.valid, plan.global_ids(batch.indices))
            rows, positions, owners = [], [], []
            for row, i in enumerate(batch.indices.tolist()):
                for r, c, first, cont in plan.targets[i]:
                    for k, token in enumerate(cont):
                        rows.append(row)
                        positions.append(first + k)
                        owners.append((r, c, token))
            logits = _logits_at(
                model, batch.tokens, batch.valid,
                torch.tensor(rows, device=device), torch.tensor(positions, device=device),
            )
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            picked = logprobs[torch.arange(len(owners)), torch.tensor([o[2] for o in owners], device=device)]
            if not torch.isfinite(picked).all():
                raise FloatingPointError(
                    f"non-finite log-likelihood in {plan.task}; try dtype=torch.float32"
                )
            for (r, c, _), lp in zip(owners, picked.tolist()):
                lls[r][c] += lp
            bar.update(len(batch.indices))
    bar.close()
    seconds = time.perf_counter() - start
    result = summarize(plan, lls, stats=abl.stats if abl is not None else None)
    result.seconds = round(seconds, 3)
    result.config = {
        **plan.config,
        "batch_size": batch_size,
        "ablation": abl.spec.to_dict() if abl is not None else None,
        "dtype": info.dtype,
        "backend": info.backend,
        "toolkit_version": toolkit_version(),
    }
    if recorder is not None:
        result.head_scores = recorder.result(scores_metadata(
            model, [f.key for f in recorder.functions], plan.inputs, description=record_description,
            batch_size=batch_size, seed=0, seconds=seconds))
    return result


def summarize(plan: EvalPlan, loglikelihoods: list[list[float]], *, stats=None) -> EvalResult:
    """Accuracy, per-question outcomes and realized zeroing from each request's choice
    log-likelihoods (and the ablation's :class:`AblationStats`, if any)."""
    lls = loglikelihoods
    golds = [req.gold for req in plan.requests]
    correct = [max(range(len(ll)), key=ll.__getitem__) == g for ll, g in zip(lls, golds)]
    result = EvalResult(
        task=plan.task,
        accuracy=sum(correct) / len(correct),
        n=len(correct),
        correct=correct,
        loglikelihoods=lls,
        n_forward_sequences=len(plan.inputs),
        n_truncated=plan.n_truncated,
    )
    if plan.task == "piqa":
        # lm-eval's acc_norm divides by the answer's length in characters (without the delimiter).
        normed = []
        for req, ll in zip(plan.requests, lls):
            lengths = [ch.norm_length for ch in req.choices]
            scores = [x / n for x, n in zip(ll, lengths)]
            normed.append(max(range(len(scores)), key=scores.__getitem__) == req.gold)
        result.correct_norm = normed
        result.acc_norm = sum(normed) / len(normed)
    subjects_seen: dict[str, list[bool]] = {}
    for req, ok in zip(plan.requests, correct):
        if req.subject is not None:
            subjects_seen.setdefault(req.subject, []).append(ok)
    result.per_subject = {s: {"accuracy": sum(v) / len(v), "n": len(v)} for s, v in subjects_seen.items()}
    if stats is not None:
        result.realized_fraction = stats.realized_fraction
        result.realized_fraction_per_layer = stats.realized_fraction_per_layer
    return result
