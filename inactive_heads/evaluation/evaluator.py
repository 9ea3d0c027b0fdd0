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

from ..ablation.coerce import as_ablation
from ..ablation.head_ablation import HeadAblation
from ..analysis.bootstrap import Interval, accuracy_interval
from ..runtime.fast_attention import FORMS, attention_form
from ..runtime.hook_registry import installed
from ..runtime.hooks import HeadHookRunner, make_batches, model_device, unembed_at
from ..runtime.lines import line_of
from ..models.loading import model_info
from ..runtime.prefix import ReuseStats, SharedPrefix, group_by_prefix, supports_prefix_reuse
from ..scoring.recording import ScoreRecorder, scores_metadata, toolkit_version
from ..scoring.scores import resolve_scores
from .generation import GenerationResult, evaluate_generation
from .plan import EvalPlan, index_forward_inputs
from .registry import plan_for_task
from .tasks import task_kind
from ..core.checks import result_fields
from ..core.errors import NonFiniteError, UserError


ATTENTION_MODES = ("auto", *FORMS)


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

    ``task="lm-eval:<task>"`` builds an lm-eval multiple-choice task's requests with lm-eval
    (:func:`~inactive_heads.evaluation.lm_eval_tasks.plan_lm_eval_task`; ``subjects`` and
    ``source`` do not apply: name an lm-eval subtask instead). The plan carries the task's metrics
    (:func:`~inactive_heads.evaluation.registry.task_spec`): PIQA's and an lm-eval task's ``acc_norm``.
    """
    if task_kind(task) == "generation":
        raise UserError(f"{task} is a generation task: run it with ih.evaluate(model, {task!r}) (or "
                        "evaluate_generation); plan_evaluation builds log-likelihood tasks")
    return plan_for_task(model, task, subjects=subjects, limit=limit, num_fewshot=num_fewshot,
                         apply_chat_template=apply_chat_template, source=source)


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
    # What prefix reuse did in this pass (evaluate's ``reuse_prefix``); not part of to_dict().
    prefix_reuse: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    # The ablation's zeroed heads per input, [input, layer, head] in plan.inputs order (None
    # without an ablation or per-input flags); not part of to_dict().
    flagged: Any = field(default=None, repr=False, compare=False)

    @property
    def accuracy_percent(self) -> float:
        return 100.0 * self.accuracy

    @property
    def questions_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("nan")

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics the task declares, by name: ``acc`` (= ``accuracy``), and ``acc_norm`` where declared."""
        return {"acc": self.accuracy, **({"acc_norm": self.acc_norm} if self.acc_norm is not None else {})}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("head_scores")
        d.pop("prefix_reuse", None)
        d.pop("flagged", None)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        return cls(**result_fields(cls, d))

    @property
    def accuracy_interval(self) -> "Interval":
        """Accuracy in % with its 95 % bootstrap interval over the questions (sampling error)."""
        return accuracy_interval(self.correct)

    def __repr__(self) -> str:
        zeroed = f", {100 * self.realized_fraction:.2f}% heads zeroed" if self.realized_fraction else ""
        if not self.correct:
            return f"EvalResult({self.task}: no questions{zeroed})"
        ci = self.accuracy_interval
        return (f"EvalResult({self.task}: accuracy {ci.estimate:.2f}% "
                f"[95% CI {ci.low:.1f}, {ci.high:.1f}] on n={self.n}{zeroed})")


def _logits_at(model, tokens, valid, rows, positions):
    """Logits at (row, position) pairs only: the unembedding runs on those rows, not the batch
    (the line's rule, :meth:`~inactive_heads.runtime.lines.base.ModelLine.logits_at`)."""
    return line_of(model).logits_at(model, tokens, valid, rows, positions)


@dataclass
class PlanPass:
    """One scoring pass over a plan: what it installs (hook runners fed every batch, the ablation,
    the recorder) and what it gives (``lls[request][choice]``; ``greedy[request][choice]``, whether
    every continuation token is the argmax, when asked; what prefix reuse did)."""

    hooks: list
    runners: list
    ablation: HeadAblation | None
    recorder: ScoreRecorder | None
    lls: list[list[float]]
    greedy: list[list[bool]] | None = None
    prefix_reuse: dict[str, Any] | None = None

    @property
    def callbacks(self) -> list:
        """What sees each layer when a shared prefix is reused: the same ablation and recorder."""
        return ([self.ablation.flags_for] if self.ablation is not None else []) + (
            [self.recorder.on_layer] if self.recorder is not None else [])

    @property
    def reads(self) -> set[str]:
        return {name for runner in self.runners for name in runner.reads}


def _prepare_pass(model, plan: EvalPlan, abl: HeadAblation | None, record, greedy: bool = False) -> PlanPass:
    """Reset the ablation's counts and build the hooks (ablation, and score recording if asked)."""
    info = model_info(model)
    runners = []
    if abl is not None:
        abl.reset(model)
        runners.append(abl.runner(model))
    recorder = None
    if record:
        if abl is not None:
            raise UserError("record= records scores of the unablated model; pass it without ablation")
        recorder = ScoreRecorder(resolve_scores(list(record)), len(plan.inputs), info.n_layers, info.n_heads,
                                 sequence_ids=plan.sequence_ids)
        runners.append(HeadHookRunner(model, recorder.on_layer, reads=recorder.reads))
    hooks = [hook for runner in runners for hook in runner.fwd_hooks()]
    lls = [[0.0] * len(req.choices) for req in plan.requests]
    hits = [[True] * len(req.choices) for req in plan.requests] if greedy else None
    return PlanPass(hooks, runners, abl, recorder, lls, hits)


def _batch_targets(plan: EvalPlan, indices: list[int], offset: int = 0):
    """(row, position) pairs to score in a batch of plan inputs, and each pair's (request, choice,
    token). ``offset`` = tokens of a reused prefix left out of the batch."""
    rows, positions, owners = [], [], []
    for row, i in enumerate(indices):
        for r, c, first, cont in plan.targets[i]:
            for k, token in enumerate(cont):
                rows.append(row)
                positions.append(first + k - offset)
                owners.append((r, c, token))
    return rows, positions, owners


def _score_batch(model, plan: EvalPlan, run: PlanPass, batch, indices: torch.Tensor) -> None:
    """Forward one right-padded batch and add its continuation log-probabilities to ``run.lls``."""
    for runner in run.runners:
        runner.set_batch(batch.valid, plan.global_ids(indices))
    device = batch.tokens.device
    rows, positions, owners = _batch_targets(plan, indices.tolist())
    logits = _logits_at(
        model, batch.tokens, batch.valid,
        torch.tensor(rows, device=device), torch.tensor(positions, device=device),
    )
    _add_loglikelihoods(plan, run, logits, owners)


def _add_loglikelihoods(plan: EvalPlan, run: PlanPass, logits, owners) -> None:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = torch.tensor([o[2] for o in owners], device=logits.device)
    picked = logprobs[torch.arange(len(owners)), tokens]
    if not torch.isfinite(picked).all():
        raise NonFiniteError(f"non-finite log-likelihood in {plan.task}; try dtype=torch.float32")
    for (r, c, _), lp in zip(owners, picked.tolist()):
        run.lls[r][c] += lp
    if run.greedy is not None:  # lm-eval's is_greedy: every continuation token is the argmax
        for (r, c, _), hit in zip(owners, (logprobs.argmax(dim=-1) == tokens).tolist()):
            run.greedy[r][c] = run.greedy[r][c] and hit


def _run_inputs(model, plan: EvalPlan, run: PlanPass, members: list[int], batch_size: int, bar) -> None:
    """Score plan inputs ``members`` in length-sorted batches."""
    with installed(model, run.hooks):
        for batch in make_batches([plan.inputs[i] for i in members], batch_size, device=model_device(model)):
            indices = torch.tensor([members[j] for j in batch.indices.tolist()], dtype=torch.long)
            _score_batch(model, plan, run, batch, indices)
            bar.update(len(indices))


def _run_shared(model, plan: EvalPlan, run: PlanPass, shared: SharedPrefix, members: list[int],
                batch_size: int, bar) -> None:
    """Score plan inputs ``members``, which all start with ``shared``'s prefix, after it."""
    offset = shared.length
    sequences = [plan.inputs[i][offset:] for i in members]
    for batch in make_batches(sequences, batch_size, device=model_device(model)):
        indices = torch.tensor([members[j] for j in batch.indices.tolist()], dtype=torch.long)
        resid = shared.forward(batch.tokens, batch.valid, plan.global_ids(indices))
        rows, positions, owners = _batch_targets(plan, indices.tolist(), offset)
        device = resid.device
        logits = unembed_at(model, resid, torch.tensor(rows, device=device), torch.tensor(positions, device=device))
        _add_loglikelihoods(plan, run, logits, owners)
        bar.update(len(indices))


def resolve_attention(attention: str, *, exact: bool) -> str:
    """The attention form a pass runs in; the one meaning of ``"auto"``, for ``evaluate`` and sweeps.

    ``"auto"`` is the exact form (TransformerLens's operations, the mask built once per forward)
    for a pass that must share arithmetic with zeroed or recorded passes (``exact=True``: it zeroes
    heads, records scores, or — every pass of a sweep — is compared with such passes, so that p = 0
    equals the baseline to the bit), and PyTorch's fused kernel otherwise. Any other mode is kept.

    >>> resolve_attention("auto", exact=True), resolve_attention("auto", exact=False), resolve_attention("eager", exact=False)
    ('exact', 'fast', 'eager')
    """
    if attention not in ATTENTION_MODES:
        raise UserError(f"attention must be one of {', '.join(map(repr, ATTENTION_MODES))}, got {attention!r}")
    if attention != "auto":
        return attention
    return "exact" if exact else "fast"


def _run_all(model, plan: EvalPlan, run: PlanPass, batch_size: int, bar, reuse_prefix: bool,
             attention: str) -> dict[str, Any]:
    """Score every plan input; with ``reuse_prefix``, inputs sharing a long prefix (an MMLU
    subject's few-shot examples) run against one cached prefix (:class:`SharedPrefix`). Returns
    what the reuse did."""
    attention = resolve_attention(attention, exact=run.recorder is not None or run.ablation is not None)
    every = list(range(len(plan.inputs)))
    with attention_form(model, attention) as fast, torch.inference_mode():
        reuse = fast and reuse_prefix and supports_prefix_reuse(model, run.ablation)
        if not reuse:
            _run_inputs(model, plan, run, every, batch_size, bar)
            return {"used": False, "attention": attention, "n_inputs": len(every), "inputs_reused": 0}
        limits = [min(first for _, _, first, _ in targets) for targets in plan.targets]
        groups, alone = group_by_prefix(plan.inputs, limits)
        if alone:
            _run_inputs(model, plan, run, alone, batch_size, bar)
        stats = ReuseStats()
        seed = run.ablation.seed if run.ablation is not None else 0
        for group in groups:
            shared = SharedPrefix(model, group.tokens, run.callbacks, reads=run.reads, seed=seed, stats=stats)
            _run_shared(model, plan, run, shared, group.members, batch_size, bar)
    return {"used": True, "attention": attention, "n_inputs": len(every), **stats.as_dict()}


def score_plan(
    model,
    plan: EvalPlan,
    ablation: HeadAblation | None = None,
    *,
    batch_size: int = 8,
    bar=None,
    reuse_prefix: bool = False,
    attention: str = "auto",
    record: Sequence[str] | None = None,
    greedy: bool = False,
) -> PlanPass:
    """The batch scorer of every log-likelihood evaluation: each plan input forwarded once.

    Length-sorted right-padded batches; only the scored (row, position) pairs are unembedded (no
    ``[batch, pos, vocab]`` logits); the attention form and prefix reuse as :func:`evaluate`
    describes them; ``ablation`` (reset first) zeroes heads in the pass, ``record`` records score
    keys. ``greedy=True`` also says, per choice, whether every continuation token is the argmax
    (lm-eval's ``is_greedy``). ``bar`` is a progress bar updated per input.
    """
    if bar is None:
        bar = tqdm(total=len(plan.inputs), disable=True)
    run = _prepare_pass(model, plan, ablation, record, greedy)
    run.prefix_reuse = _run_all(model, plan, run, batch_size, bar, reuse_prefix, attention)
    return run


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
    reuse_prefix: bool = False,
    attention: str = "auto",
    decision: str | None = None,
    max_gen_toks: int | None = None,
    bar=None,
) -> "EvalResult | GenerationResult":
    """Accuracy of ``model`` on a task, optionally with heads zeroed by ``ablation``.

    >>> res = evaluate(model, "mmlu", subjects=["anatomy"], limit=20)             # doctest: +SKIP
    >>> res = evaluate(model, "mmlu", subjects=["anatomy"], limit=20,
    ...                ablation=DynamicAblation("ahon_ln", 0.4))                  # doctest: +SKIP
    >>> res.accuracy, res.realized_fraction                                       # doctest: +SKIP

    ``ablation``: a :class:`HeadAblation` (kept itself), an :class:`AblationSpec`, a spec dict
    (``ablation.to_spec()``, any registered kind) or text (``"ahon_ln@0.8"``), read by
    :func:`~inactive_heads.ablation.coerce.as_ablation`.
    ``task`` is "mmlu", "piqa" or "winogrande", "lm-eval:<task>" (an lm-eval multiple-choice task,
    its requests built by lm-eval), "gsm8k" (below), or an :class:`EvalPlan` from
    :func:`plan_evaluation`, to tokenize once for many runs (the plan holds its options: passing
    ``subjects``, ``limit``, ``num_fewshot``, ``apply_chat_template`` or ``source`` with it is an
    error). Names are dispatched by :func:`~inactive_heads.evaluation.registry.plan_for_task`; the
    result reports the metrics the task declares (:func:`~inactive_heads.evaluation.registry.task_spec`:
    ``acc``, and ``acc_norm`` for PIQA and lm-eval tasks that list it). ``apply_chat_template=None`` follows
    the paper: on for chat/instruct models. ``limit`` = first N questions (of each MMLU subject).
    Batches are length-sorted and right-padded with an attention mask; pads never reach real
    tokens, so results do not depend on ``batch_size``. ``record`` = score keys to record in the
    same pass (``result.head_scores``, as :func:`record_scores` would on ``plan.inputs``).
    A ``HookedTransformer`` runs :mod:`inactive_heads.runtime.fast_attention`. ``attention="auto"``
    (default): PyTorch's fused kernel for a plain run (log-likelihoods within float rounding of
    TransformerLens's, ~2e-5), and the exact form — TransformerLens's operations with the mask
    built once per forward — for any run that zeroes heads or records scores, so in-pass scores
    equal :func:`record_scores`'s to the bit and a run that zeroes nothing equals the exact plain
    pass to the bit (sweeps run every pass in the exact form).
    ``"exact"`` / ``"fast"`` force one form; ``"eager"`` runs TransformerLens's own attention.
    ``reuse_prefix=True``: inputs sharing a long prefix (MMLU few-shot examples) run against a
    cache of it, computed once per distinct history of zeroing decisions (plain, static, dynamic
    and recording alike; Random always runs in full) — :mod:`inactive_heads.runtime.prefix`; the same
    numbers up to float rounding, not to the bit. ``result.prefix_reuse`` says what was reused.

    ``task="gsm8k"`` generates (:func:`~inactive_heads.evaluation.generation.evaluate_generation`,
    a :class:`GenerationResult`): ``decision`` = ``"per_step"`` (default, the authors' protocol)
    or ``"prompt"``, ``max_gen_toks`` (default 256); ``reuse_prefix=True`` with ``per_step`` runs
    the few-shot prefix once per decision history (the same tokens up to float rounding).

    ``bar``: a tqdm bar that a log-likelihood pass advances by one per input instead of its own
    (a sweep's one bar over all its passes); it is left open.
    """
    if isinstance(task, EvalPlan):
        _refuse_plan_options(subjects=subjects, limit=limit, num_fewshot=num_fewshot,
                             apply_chat_template=apply_chat_template, source=source)
    elif task_kind(task) == "generation":
        if subjects is not None or source is not None or record or attention != "auto":
            raise UserError(f"{task} is a generation task: subjects, source, record and attention apply to "
                            "log-likelihood tasks only; leave them unset")
        return _generation_task(model, task, ablation, decision=decision, limit=limit, num_fewshot=num_fewshot,
                                apply_chat_template=apply_chat_template, max_gen_toks=max_gen_toks,
                                reuse_prefix=reuse_prefix, batch_size=batch_size, progress=progress)
    if decision is not None or max_gen_toks is not None:
        raise UserError("decision and max_gen_toks apply to generation tasks (gsm8k) only; leave them unset")
    plan = task if isinstance(task, EvalPlan) else plan_for_task(
        model, task, subjects=subjects, limit=limit, num_fewshot=num_fewshot,
        apply_chat_template=apply_chat_template, source=source,
    )
    return _evaluate_plan(model, plan, as_ablation(ablation), batch_size=batch_size, progress=progress,
                          reuse_prefix=reuse_prefix, attention=attention, record=record,
                          record_description=record_description, bar=bar)


def _generation_task(model, task: str, ablation, *, decision, limit, num_fewshot, apply_chat_template,
                     max_gen_toks, reuse_prefix, batch_size, progress) -> GenerationResult:
    """:func:`evaluate` of a generation task: its requests planned once, then generated."""
    requests = plan_for_task(model, task, limit=limit, num_fewshot=num_fewshot,
                             apply_chat_template=apply_chat_template)
    return evaluate_generation(
        model, task, ablation=as_ablation(ablation), decision=decision or "per_step", limit=limit,
        num_fewshot=num_fewshot, apply_chat_template=apply_chat_template, max_gen_toks=max_gen_toks,
        reuse_prefix=reuse_prefix, batch_size=batch_size, progress=progress, requests=requests,
    )


def _refuse_plan_options(**options) -> None:
    """``evaluate(plan, ...)``: a plan holds the options it was built with; others are an error."""
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise UserError(f"evaluate got a plan and {', '.join(given)}: a plan is built with its options; pass "
                        "them to plan_evaluation, or pass the task name instead of the plan")


def _evaluate_plan(model, plan: EvalPlan, abl: HeadAblation | None, *, batch_size: int, progress: bool,
                   reuse_prefix: bool, attention: str, record, record_description: str | None,
                   bar=None) -> EvalResult:
    """:func:`evaluate` of a log-likelihood plan: one scoring pass, summarized, with its config."""
    info = model_info(model)
    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=len(plan.inputs), desc=f"{plan.task}" + (f" [{abl.name}]" if abl else ""),
                   unit="seq", disable=not progress, leave=False)
    start = time.perf_counter()
    run = score_plan(model, plan, abl, batch_size=batch_size, bar=bar, reuse_prefix=reuse_prefix,
                     attention=attention, record=record)
    reuse_info = run.prefix_reuse
    if own_bar:
        bar.close()
    seconds = time.perf_counter() - start
    result = summarize(plan, run.lls, stats=abl.stats if abl is not None else None)
    result.seconds = round(seconds, 3)
    result.prefix_reuse = reuse_info
    result.config = {
        **plan.config,
        "batch_size": batch_size,
        "ablation": abl.describe() if abl is not None else None,
        "dtype": info.dtype,
        "backend": info.backend,
        "toolkit_version": toolkit_version(),
    }
    if run.recorder is not None:
        result.head_scores = run.recorder.result(scores_metadata(
            model, [f.key for f in run.recorder.functions], plan.inputs, description=record_description,
            batch_size=batch_size, seed=0, seconds=seconds))
    return result


def summarize(plan: EvalPlan, loglikelihoods: list[list[float]], *, stats=None) -> EvalResult:
    """Accuracy, per-question outcomes and realized zeroing from each request's choice
    log-likelihoods (and the ablation's :class:`AblationStats`, if any). The metrics are the plan's
    (``plan.metrics``): ``acc`` always, ``acc_norm`` (and ``correct_norm``) where the task declares it."""
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
    if "acc_norm" in plan.metrics:
        # lm-eval's acc_norm divides by the answer's length in characters (without the delimiter).
        normed = []
        for req, ll in zip(plan.requests, lls):
            lengths = [ch.norm_length for ch in req.choices]
            if not all(lengths):
                raise UserError(f"{plan.task} declares acc_norm but request {req.doc_id} has a choice without a "
                                "character length (Choice.norm_length); build the plan with its task's lengths")
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
        result.flagged = _flags_per_input(plan, stats)
    return result


def _flags_per_input(plan: EvalPlan, stats) -> torch.Tensor | None:
    """``stats``' per-sequence flags for the plan's inputs, in input order (None if it has none)."""
    if not stats.masks:
        return None
    ids = list(range(len(plan.inputs))) if plan.sequence_ids is None else list(plan.sequence_ids)
    if any(i not in stats.masks for i in ids):
        return None  # flags kept for other sequence ids (e.g. shared prefixes): no per-input view
    return torch.stack([stats.masks[i] for i in ids])
