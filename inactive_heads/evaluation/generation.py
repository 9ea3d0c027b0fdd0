"""Greedy generation with heads zeroed, in two decision modes, and GSM8K exact match.

``decision="per_step"`` is the authors' protocol: no KV cache; at every new token the whole
sequence (prompt + what was generated so far) runs again, every score is recomputed over all
its positions and the heads are re-chosen, so the choice can change as the answer grows.

``decision="prompt"`` decides once on the prompt and holds those heads, for that prompt, through
every generated token. It can use a KV cache (``use_cache=True``, a ``HookedTransformer``):
the prompts are left-padded, prefilled once and decoded one token per step, each row stopping
on its own; ``use_cache=False`` re-runs the whole sequence at every step with the same held
heads (what the cached run must equal, token for token).

Realized fraction, counted per forward pass as the paper counts it: every generated token comes
from one forward pass of its sequence, so each (generated token, layer, head) is one triple; the
fraction is zeroed triples over all triples. In ``per_step`` each pass makes its own decision;
in ``prompt`` every pass of a sequence carries its prompt's decision, so each prompt's flags
count once per token it generated. ``realized_fraction_prompts`` is the plain per-prompt count.

Savings (``prompt`` only, "estimated": TransformerLens still computes the held heads, then
zeroes them): attention FLOPs of held heads at decode (scores and weighted sum,
``4 · d_head · keys`` per head and token) and KV-cache bytes of KV heads whose whole query
group is held (``2 · d_head · bytes`` per layer, KV head and token).
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor
from tqdm.auto import tqdm

from ..ablation.coerce import as_ablation
from ..ablation.head_ablation import HeadAblation
from ..analysis.bootstrap import Interval, accuracy_interval
from ..core.checks import result_fields
from ..core.errors import UserError, WrongTypeError
from ..models.loading import model_info
from ..runtime.fast_attention import attention_form
from ..runtime.hooks import HeadHookRunner, check_token_ids, installed, make_batches, model_device, run_forward, unembed_at
from ..runtime.lines import line_of
from ..runtime.prefix import ReuseStats, SharedPrefix, group_by_prefix, supports_prefix_reuse
from ..scoring.recording import toolkit_version
from ..scoring.scores import GENERATION_STEP_SHIFT, generation_id
from .decoding import (
    HeldHeads,
    Stopper,
    decode_cached,
    decode_decided,
    decode_skipped,
    decode_uncached,
    held_savings,
)
from .gsm8k import GSM8K_MAX_GEN_TOKS, GenerationRequest
from .tasks import registered_task, task_names

DECISIONS = ("per_step", "prompt")


@dataclass
class GenerationOutput:
    """Generated tokens per prompt and what the ablation did while generating them."""

    tokens: list[list[int]]
    decision: str
    use_cache: bool
    realized_fraction: float = 0.0
    realized_fraction_per_layer: list[float] = field(default_factory=list)
    realized_fraction_prompts: float | None = None
    n_forward_passes: int = 0
    savings: dict[str, Any] | None = None
    seconds: float = 0.0
    # What prefix reuse did (per_step with reuse_prefix=True; ReuseStats' counts).
    prefix_reuse: dict[str, Any] | None = None
    # What real skipping did (skip=True): KV bytes measured and predicted, groups held.
    skipping: dict[str, Any] | None = None


def check_prompts(model, prompts, max_new: int) -> list[list[int]]:
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise UserError(f"max_new_tokens must be a positive integer, got {max_new!r}")
    n_ctx = model_info(model).n_ctx
    if max_new >= n_ctx:
        raise UserError(f"max_new_tokens {max_new} must be less than the model context {n_ctx}")
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Iterable):
        raise WrongTypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    d_vocab = model.cfg.d_vocab
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes, dict)) or not isinstance(p, Iterable):
            raise WrongTypeError(f"prompt {i} must be a list of token ids, got {type(p).__name__}")
        ids = list(p)
        check_token_ids(ids, f"prompt {i}", d_vocab)
        ids = [int(t) for t in ids]
        if not ids:
            raise UserError(f"prompt {i} is empty; give it at least one token")
        out.append(ids[-(n_ctx - max_new):])  # left-truncated as lm-eval does
    if not out:
        raise UserError("prompts is empty; pass at least one token-id list")
    return out


def generate(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    ablation=None,
    decision: str = "per_step",
    max_new_tokens: int = GSM8K_MAX_GEN_TOKS,
    until: Sequence[str] = (),
    eos_token_id: int | None = None,
    use_cache: bool = True,
    reuse_prefix: bool = False,
    batch_size: int = 8,
    progress: bool = True,
    prompt_ids: Sequence[int] | None = None,
    skip: bool = False,
    hold_groups: float | None = None,
) -> GenerationOutput:
    """Greedy generation from token-id prompts with heads zeroed by ``ablation``.

    >>> out = generate(model, [ids], ablation=DynamicAblation("ahon_ln", 0.4),
    ...                decision="per_step", max_new_tokens=32)                 # doctest: +SKIP
    >>> out.tokens[0], out.realized_fraction                                  # doctest: +SKIP

    ``decision``: ``"per_step"`` (no cache; heads re-decided at every token, the authors'
    protocol) or ``"prompt"`` (decided on the prompt and held; KV cache when ``use_cache``).
    Each row stops at ``eos_token_id`` (default: the tokenizer's), at ``max_new_tokens``, or
    once a string of ``until`` appears in its decoded tokens; ``tokens`` include the stopping
    token. Results do not depend on ``batch_size``.

    ``reuse_prefix=True`` (``per_step`` only): every state is computed once per decision history:
    the few-shot prefix the prompts share once for all of them, and at each step only the newest
    token against the sequence so far, recomputed from a layer on only where that layer decides
    otherwise than at the step before. The numbers equal a full re-run up to float rounding (as
    ``evaluate``'s ``reuse_prefix``), so a token can differ only where two logits tie within
    rounding. Random shares nothing and runs in full. ``prefix_reuse`` in the output says what it
    did.

    ``prompt_ids``: each prompt's index in the whole task (default: its position in ``prompts``).
    Random draws are seeded by it, so a part of the prompts (a Ray shard) draws as the whole would.

    ``skip=True`` (``decision="prompt"`` with the cache): the held heads are really not computed
    (:mod:`inactive_heads.pruning.skipping`): prompts that hold the same heads are batched
    together, each batch's cache keeps only the KV heads some kept query head reads, and the
    tokens equal the simulated run's. ``out.skipping`` reports the resident KV bytes measured
    from the cache tensors beside the accountant's prediction. ``hold_groups`` (``"prompt"``
    only; a share in (0, 1]): under grouped-query attention a KV group is held whole when at
    least that share of its query heads is held (docs/skipping.md, "The group-level rule").
    """
    _check_options(model, decision, batch_size, reuse_prefix, skip, use_cache, hold_groups, until, eos_token_id)
    prompts = check_prompts(model, prompts, max_new_tokens)
    ids = list(range(len(prompts))) if prompt_ids is None else [int(i) for i in prompt_ids]
    if len(ids) != len(prompts) or len(set(ids)) != len(ids) or not 0 <= min(ids) <= max(ids) < MAX_PROMPT_ID:
        raise UserError(f"prompt_ids must give each of the {len(prompts)} prompts its own index in 0..{MAX_PROMPT_ID - 1}; "
                        f"got {len(ids)} ids, {len(set(ids))} distinct, from {min(ids)} to {max(ids)}")
    abl = as_ablation(ablation)
    tokenizer = getattr(model, "tokenizer", None)
    if until and tokenizer is None:
        raise UserError("until= needs the model's tokenizer to decode; pass until=() or a model with a tokenizer")
    eos = getattr(tokenizer, "eos_token_id", None) if eos_token_id is None else eos_token_id
    stopper = Stopper(tokenizer, eos, until, max_new_tokens)
    start = time.perf_counter()
    bar = tqdm(total=len(prompts), desc=f"generate [{decision}]", unit="seq", disable=not progress, leave=False)
    if decision == "per_step":
        out = _per_step(model, prompts, abl, stopper, batch_size, bar, reuse_prefix, ids)
    else:
        out = _held(model, prompts, abl, stopper, batch_size, bar, use_cache, ids, skip, hold_groups)
    bar.close()
    out.seconds = round(time.perf_counter() - start, 3)
    return out


MAX_PROMPT_ID = 1 << GENERATION_STEP_SHIFT  # prompt ids below it keep generation ids distinct


def _check_options(model, decision, batch_size, reuse_prefix, skip, use_cache, hold_groups, until,
                   eos_token_id) -> None:
    """:func:`generate`'s options, each wrong one a one-line error naming it."""
    if decision not in DECISIONS:
        raise UserError(f"decision must be one of {', '.join(map(repr, DECISIONS))}, got {decision!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    if reuse_prefix and decision != "per_step":
        raise UserError("reuse_prefix applies to decision='per_step' (decision='prompt' computes each prompt "
                        "once already); drop reuse_prefix or use decision='per_step'")
    if skip and (decision != "prompt" or not use_cache):
        raise UserError("skip=True needs decision='prompt' and use_cache=True (the held heads are decided once, "
                        "then not computed); drop skip or use decision='prompt'")
    if hold_groups is not None and decision != "prompt":
        raise UserError("hold_groups applies to decision='prompt'; drop hold_groups or use decision='prompt'")
    if hold_groups is not None:
        from ..pruning.skipping import check_group_fraction

        check_group_fraction(hold_groups)
    if skip:
        from ..pruning.skipping import check_supported

        check_supported(model)
    if isinstance(until, str) or not isinstance(until, (list, tuple)) or not all(isinstance(s, str) for s in until):
        raise WrongTypeError(f"until must be a list of stop strings, e.g. ['Question:'], got {until!r}")
    if eos_token_id is not None and (isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int)
                                     or eos_token_id < 0):
        raise UserError(f"eos_token_id must be a token id (an integer >= 0) or None, got {eos_token_id!r}")


def _per_step(model, prompts, abl, stopper, batch_size, bar, reuse_prefix: bool,
              prompt_ids: list[int]) -> GenerationOutput:
    """No KV cache: each step re-runs every unfinished sequence whole, deciding the heads anew.

    With ``reuse_prefix`` (and an ablation that shares prefixes: not Random), each sequence runs
    one at a time against a :class:`~inactive_heads.runtime.prefix.SharedPrefix` of everything
    before its newest token (:func:`_per_step_reused`)."""
    generated: list[list[int]] = [[] for _ in prompts]
    hooks, runner = [], None
    if abl is not None:
        abl.reset(model)
        runner = HeadHookRunner(model, abl.on_layer, reads=abl.reads, seed=abl.seed)
        hooks = runner.fwd_hooks()
    reuse: dict[str, Any] = {"used": False}

    def ids_of(members: list[int]) -> Tensor:
        # One sequence id per (prompt, step), whatever max_new: Random draws anew at every pass.
        return torch.tensor([generation_id(prompt_ids[i], len(generated[i])) for i in members], dtype=torch.long)

    with attention_form(model, "exact") as fast, torch.inference_mode():
        if reuse_prefix and fast and supports_prefix_reuse(model, abl):
            reuse = _per_step_reused(model, prompts, abl, stopper, bar, generated, ids_of)
        else:
            def prepare(members: list[int], valid: Tensor) -> None:
                if runner is not None:
                    runner.set_batch(valid, ids_of(members))

            with installed(model, hooks):
                decode_uncached(model, prompts, generated, stopper, batch_size, bar, prepare)
    passes = sum(len(g) for g in generated)  # one forward pass per generated token
    out = GenerationOutput(generated, "per_step", False, n_forward_passes=passes, prefix_reuse=reuse)
    if abl is not None:
        out.realized_fraction = abl.stats.realized_fraction
        out.realized_fraction_per_layer = abl.stats.realized_fraction_per_layer
    return out


def _per_step_reused(model, prompts, abl, stopper, bar, generated, ids_of) -> dict[str, Any]:
    """Per-step generation that computes each state once per decision history.

    At step ``t`` a sequence is its prompt plus ``t - 1`` generated tokens; everything before the
    newest token was run at earlier steps. Each sequence therefore runs against a
    :class:`~inactive_heads.runtime.prefix.SharedPrefix` of all but its newest token: only that
    token's rows are computed, every score still sees the whole sequence (the prefix's rows joined
    with the new one), and the heads are still re-chosen at every layer of every step. While the
    decisions repeat those of the step before, the prefix holds; where a layer decides otherwise,
    the prefix is recomputed from that layer on under the new decisions (a branch), exactly as a
    full re-run would. Afterwards the prefix is extended by the new token
    (:meth:`~inactive_heads.runtime.prefix.SharedPrefix.extended`).

    The first step starts from the few-shot examples the prompts share (:func:`group_by_prefix`),
    computed once for all of them; a prompt that shares nothing starts from its own tokens but the
    last. Sequences run one at a time (a single row per step), so ``batch_size`` does not apply."""
    callbacks = [abl.flags_for] if abl is not None else []
    reads = abl.reads if abl is not None else ("z",)
    seed = abl.seed if abl is not None else 0
    stats = ReuseStats()

    def make(tokens: list[int]) -> SharedPrefix:
        return SharedPrefix(model, tokens, callbacks, reads=reads, seed=seed, stats=stats)

    groups, alone = group_by_prefix(prompts, [len(p) - 1 for p in prompts])
    start: dict[int, SharedPrefix] = {}
    for group in groups:
        shared = make(group.tokens)
        start.update({i: shared for i in group.members})
    device = model_device(model)
    first = torch.zeros(1, dtype=torch.long, device=device)
    for i in range(len(prompts)):
        prefix = start.pop(i) if i in start else make(prompts[i][:-1])
        rest = prompts[i][prefix.length:]
        while True:
            tokens = torch.tensor([rest], dtype=torch.long, device=device)
            resid = prefix.forward(tokens, torch.ones_like(tokens, dtype=torch.bool), ids_of([i]), keep=True)
            logits = unembed_at(model, resid, first, torch.full_like(first, len(rest) - 1))
            generated[i].append(int(logits.argmax(dim=-1)))
            if stopper.done(generated[i]):
                bar.update(1)
                break
            (prefix,) = prefix.extended()
            rest = generated[i][-1:]
    return {"used": True, "n_prompts": len(prompts), "prompts_reused": len(prompts),
            "prompts_sharing_a_prefix": sum(len(g.members) for g in groups), **stats.as_dict()}


def decide_on_prompts(model, prompts: Sequence[Sequence[int]], ablation: HeadAblation, batch_size: int = 8,
                      prompt_ids: Sequence[int] | None = None) -> Bool[Tensor, "prompt layer head"]:
    """The heads ``ablation`` zeroes on each prompt (one right-padded pass, nothing after the last
    layer's ``hook_z``), as ``[prompt, layer, head]`` flags; ``ablation.stats`` counts them, keyed by
    ``prompt_ids`` (the sequence ids; default: positions in ``prompts``)."""
    ids = torch.arange(len(prompts)) if prompt_ids is None else torch.tensor(list(prompt_ids), dtype=torch.long)
    ablation.reset(model)
    runner = HeadHookRunner(model, ablation.on_layer, reads=ablation.reads, seed=ablation.seed,
                            stop_after_last_layer=True)
    with installed(model, runner.fwd_hooks()), torch.inference_mode():
        for batch in make_batches(prompts, batch_size, device=model_device(model)):
            runner.set_batch(batch.valid, ids[batch.indices])
            run_forward(model, batch.tokens, batch.valid, stop_early=True)
    return ablation.stats.flagged_mask(n=int(ids.max()) + 1 if len(ids) else 0)[ids]


def _held(model, prompts, abl, stopper, batch_size, bar, use_cache, prompt_ids: list[int], skip: bool = False,
          hold_groups: float | None = None) -> GenerationOutput:
    from ..pruning.skipping import Decider

    info = model_info(model)
    cached = use_cache and line_of(model).cached_decoder(model) is not None
    skipped = None
    if skip and not cached:
        raise UserError("skip=True needs a model with a cached decode (a HookedTransformer, or a bridge whose "
                        "head is one linear map)")
    if skip and hold_groups is None and isinstance(abl, Decider):
        # a causal decider (the predictor) decides inside the skipped prefill: no separate decision pass
        abl.reset(model)
        with torch.inference_mode():
            generated, skipped, masks = decode_decided(model, prompts, abl, stopper, bar)
        masks = masks.clone()  # a normal tensor (made under inference mode), counted as a decision pass would
        ids = torch.tensor(prompt_ids, dtype=torch.long)
        for layer in range(info.n_layers):
            abl.stats.add(layer, ids, masks[:, layer], batch=0)
    else:
        masks = (decide_on_prompts(model, prompts, abl, batch_size, prompt_ids) if abl is not None
                 else torch.zeros((len(prompts), info.n_layers, info.n_heads), dtype=torch.bool))
        if hold_groups is not None:
            from ..pruning.skipping import group_level

            masks = group_level(masks, info.n_kv_heads, hold_groups)
        if skip:
            with torch.inference_mode():
                generated, skipped = decode_skipped(model, prompts, masks, stopper, batch_size, bar)
        else:
            held = HeldHeads(model)
            with installed(model, held.hooks()), torch.inference_mode():
                if cached:
                    generated = decode_cached(model, prompts, masks, held, stopper, batch_size, bar)
                else:
                    generated = [[] for _ in prompts]
                    decode_uncached(model, prompts, generated, stopper, batch_size, bar,
                                     lambda members, valid: setattr(held, "masks", masks[members]))
    tokens = [len(g) for g in generated]
    out = GenerationOutput(generated, "prompt", cached, n_forward_passes=sum(tokens))
    if abl is not None:
        weights = torch.tensor(tokens, dtype=torch.float64)
        flagged = masks.double().sum(dim=2)  # [prompt, layer]
        total = weights.sum() * info.n_heads
        out.realized_fraction = float((weights[:, None] * flagged).sum() / (total * info.n_layers))
        out.realized_fraction_per_layer = ((weights[:, None] * flagged).sum(dim=0) / total).tolist()
        out.realized_fraction_prompts = abl.stats.realized_fraction
    out.savings = held_savings(model, prompts, masks, tokens)
    out.skipping = skipped
    return out


# ----------------------------------------------------------------------------------------------
# GSM8K


@dataclass
class GenerationResult:
    """GSM8K exact match (strict and flexible) with per-question generations and answers."""

    task: str
    accuracy: float  # exact match, strict-match filter (the paper's metric)
    accuracy_flexible: float
    n: int
    correct: list[bool]
    correct_flexible: list[bool]
    generations: list[str]
    answers: list[dict[str, str]]
    golds: list[str]
    decision: str = "prompt"
    use_cache: bool = False
    realized_fraction: float = 0.0
    realized_fraction_per_layer: list[float] = field(default_factory=list)
    realized_fraction_prompts: float | None = None
    n_forward_passes: int = 0
    n_generated_tokens: int = 0
    n_generated_per_question: list[int] = field(default_factory=list)  # what a sharded run merges from
    savings: dict[str, Any] | None = None
    prefix_reuse: dict[str, Any] | None = None  # per_step with reuse_prefix: what the reuse did
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def accuracy_percent(self) -> float:
        return 100.0 * self.accuracy

    @property
    def accuracy_interval(self) -> Interval:
        """Strict exact match in % with its 95 % bootstrap interval over the questions."""
        return accuracy_interval(self.correct)

    @property
    def accuracy_flexible_interval(self) -> Interval:
        return accuracy_interval(self.correct_flexible)

    @property
    def metrics(self) -> dict[str, float]:
        """The task's declared metric by name: ``exact_match`` (= ``accuracy``, the strict filter)."""
        return {"exact_match": self.accuracy}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GenerationResult":
        return cls(**result_fields(cls, d))

    def __repr__(self) -> str:
        zeroed = f", {100 * self.realized_fraction:.2f}% heads zeroed" if self.realized_fraction else ""
        if not self.correct:
            return f"GenerationResult({self.task}: no questions{zeroed})"
        ci = self.accuracy_interval
        return (f"GenerationResult({self.task} [{self.decision}]: exact match {ci.estimate:.2f}% "
                f"[95% CI {ci.low:.1f}, {ci.high:.1f}] on n={self.n}{zeroed})")


def evaluate_generation(
    model,
    task: str = "gsm8k",
    *,
    ablation=None,
    decision: str = "per_step",
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool | None = None,
    max_gen_toks: int | None = None,
    use_cache: bool = True,
    reuse_prefix: bool = False,
    batch_size: int = 8,
    progress: bool = True,
    requests: Sequence[GenerationRequest] | None = None,
    prompt_ids: Sequence[int] | None = None,
) -> GenerationResult:
    """Exact match of ``model`` on a generation task (``ih.evaluate(model, "gsm8k")``), optionally with heads zeroed.

    Greedy, ``max_gen_toks`` (default 256) new tokens, lm-eval's stop strings plus the
    tokenizer's EOS; the generation is cut at the first stop string, then lm-eval's strict
    (``#### N``) and flexible (last number) filters extract the answer. ``decision`` as in
    :func:`generate`. ``requests`` = prebuilt requests (the task's ``build_generation``, for gsm8k
    :func:`~inactive_heads.evaluation.gsm8k.build_gsm8k_requests`);
    ``prompt_ids`` = each request's index in the whole task, as :func:`generate` takes them.
    """
    if task not in task_names("generation"):
        raise UserError(f"unknown generation task {task!r}; known: {', '.join(task_names('generation'))}")
    spec = registered_task(task)
    info = model_info(model)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    if requests is None:
        requests = spec.build_generation(model.tokenizer, limit=limit, num_fewshot=num_fewshot,
                                         apply_chat_template=chat, prepend_bos=info.prepend_bos)
    max_new = (spec.max_gen_toks or GSM8K_MAX_GEN_TOKS) if max_gen_toks is None else max_gen_toks
    abl = as_ablation(ablation)
    until = requests[0].until if requests else ()
    out = generate(model, [r.context_ids for r in requests], ablation=abl, decision=decision,
                   max_new_tokens=max_new, until=until, use_cache=use_cache, reuse_prefix=reuse_prefix,
                   batch_size=batch_size, progress=progress, prompt_ids=prompt_ids)
    generations, answers, strict, flexible = _read_answers(spec, requests, out.tokens, model.tokenizer)
    n = len(requests)
    return GenerationResult(
        task=task,
        accuracy=sum(strict) / n if n else 0.0,
        accuracy_flexible=sum(flexible) / n if n else 0.0,
        n=n,
        correct=strict,
        correct_flexible=flexible,
        generations=generations,
        answers=answers,
        golds=[r.gold for r in requests],
        decision=decision,
        use_cache=out.use_cache,
        realized_fraction=out.realized_fraction,
        realized_fraction_per_layer=out.realized_fraction_per_layer,
        realized_fraction_prompts=out.realized_fraction_prompts,
        n_forward_passes=out.n_forward_passes,
        n_generated_tokens=sum(len(t) for t in out.tokens),
        n_generated_per_question=[len(t) for t in out.tokens],
        savings=out.savings,
        prefix_reuse=out.prefix_reuse,
        seconds=out.seconds,
        config={
            "model": info.name, "task": task, "limit": limit, "num_fewshot": num_fewshot,
            "apply_chat_template": chat, "prepend_bos": info.prepend_bos, "max_gen_toks": max_new,
            "decision": decision, "use_cache": use_cache, "reuse_prefix": reuse_prefix, "batch_size": batch_size,
            "ablation": abl.describe() if abl is not None else None, "dtype": info.dtype,
            "backend": info.backend, "toolkit_version": toolkit_version(),
        },
    )


def _read_answers(spec, requests: Sequence[GenerationRequest], tokens: list[list[int]], tokenizer):
    """Each generation decoded and cut at its first stop string, the answers the task's filters
    extract from it (``{filter: answer}``: the first is scored as accuracy, the last as
    accuracy_flexible; gsm8k: strict-match, flexible-extract) and whether each matches the gold."""
    generations, answers, strict, flexible = [], [], [], []
    for req, toks in zip(requests, tokens):
        text = tokenizer.decode(toks, skip_special_tokens=True)
        for stop in req.until:
            text = text.split(stop)[0]
        extracted = spec.extract_answers(text)
        filtered = list(extracted.values())
        generations.append(text)
        answers.append(extracted)
        strict.append(spec.answer_matches(filtered[0], req.gold))
        flexible.append(spec.answer_matches(filtered[-1], req.gold))
    return generations, answers, strict, flexible
