"""The decoders of greedy generation (:mod:`inactive_heads.evaluation.generation`): one token per
step for every unfinished row, each row stopping on its own.

- :func:`decode_uncached`: no cache; every step re-runs each sequence whole (the ``per_step``
  decision, and ``prompt`` without a cache).
- :func:`decode_cached`: held heads with a KV cache, prefilled once per left-padded batch.
- :func:`decode_skipped` and :func:`decode_decided`: held heads really not computed
  (:mod:`inactive_heads.pruning.skipping`), the cache keeping only the KV heads still read.

:class:`HeldHeads` zeroes the held heads at ``hook_z``; :func:`held_savings` estimates what they
need not cost.
"""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..models.loading import model_info
from ..runtime.hooks import HeadHookRunner, make_batches, model_device, zero_heads
from ..runtime.lines import line_of


class HeldHeads:
    """Zeroes, per row, the heads in ``masks[row, layer]`` (set per batch) at every layer's
    ``hook_z``: the hook runner's hooks, with a callback that reads the mask instead of deciding."""

    def __init__(self, model):
        self.masks: Bool[Tensor, "batch layer head"] | None = None
        self.runner = HeadHookRunner(model, self.on_layer, reads=())

    def on_layer(self, acts) -> Float[Tensor, "batch pos head d_head"]:
        return zero_heads(acts.z, self.masks[:, acts.layer])

    def hooks(self) -> list:
        return self.runner.fwd_hooks()


def last_logits(model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"]) -> Tensor:
    """Logits at each row's last real position of a right-padded batch (the exact attention form)."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    last = valid.sum(dim=1).to(tokens.device) - 1
    return line_of(model).last_logits(model, tokens, valid, rows, last)


class Stopper:
    """Per-row stop: the EOS token, ``max_new`` tokens, or a stop string in the decoded text."""

    def __init__(self, tokenizer, eos_id: int | None, until: Sequence[str], max_new: int):
        self.tokenizer, self.eos_id, self.max_new = tokenizer, eos_id, max_new
        self.until = [s for s in until if s]

    def done(self, generated: list[int]) -> bool:
        if len(generated) >= self.max_new or (self.eos_id is not None and generated[-1] == self.eos_id):
            return True
        if not self.until:
            return False
        text = self.tokenizer.decode(generated, skip_special_tokens=False)
        return any(stop in text for stop in self.until)


def decode_uncached(model, prompts, generated: list[list[int]], stopper, batch_size, bar, prepare) -> None:
    """No cache: every step re-runs each unfinished sequence whole (right-padded batches), appending
    each row's greedy token to ``generated``; ``prepare(members, valid)`` first sets the hooks'
    state for the batch (its rows' prompt indices and valid mask). Each row stops on its own."""
    active = list(range(len(prompts)))
    while active:
        seqs = [prompts[i] + generated[i] for i in active]
        for batch in make_batches(seqs, batch_size, device=model_device(model)):
            members = [active[j] for j in batch.indices.tolist()]
            prepare(members, batch.valid)
            nxt = last_logits(model, batch.tokens, batch.valid).argmax(dim=-1).tolist()
            for i, t in zip(members, nxt):
                generated[i].append(int(t))
        finished = {i for i in active if stopper.done(generated[i])}
        bar.update(len(finished))
        active = [i for i in active if i not in finished]


def decode_cached(model, prompts, masks, held, stopper, batch_size, bar) -> list[list[int]]:
    """Held heads with a KV cache: batches of prompts left-padded and prefilled once, then one token
    per step; a finished row leaves the batch (and its cache rows). TransformerLens's cache on a
    ``HookedTransformer``, Hugging Face's on a bridge (the line's
    :meth:`~inactive_heads.runtime.lines.base.ModelLine.cached_decoder`)."""
    cached = line_of(model).cached_decoder(model)
    device = model_device(model)
    generated: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        held.masks = masks[rows]
        with cached.forms(model):
            batch = cached(model, *(t.to(device) for t in left_padded(prompts, rows)))

            def rows_left(rows: list[int]) -> None:
                held.masks = masks[rows]

            _decode_batch(batch, rows, generated, stopper, bar, rows_left)
    return generated


def _decode_batch(batch, rows: list[int], generated: list[list[int]], stopper, bar, rows_left) -> tuple[int, int]:
    """Greedy decoding of one prefilled batch until every row is done: each step appends each row's
    token, drops the rows that are done (``rows_left(rows)`` is told the rows still running) and
    steps the rest. Returns how many rows ran the last step and how many steps ran."""
    device = batch.logits.device
    nxt = batch.logits.argmax(dim=-1)
    steps = 0
    while True:
        keep = []
        for r, (i, t) in enumerate(zip(rows, nxt.tolist())):
            generated[i].append(int(t))
            if stopper.done(generated[i]):
                bar.update(1)
            else:
                keep.append(r)
        if not keep:
            return len(rows), steps
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            batch.keep(index)
            rows, nxt = [rows[r] for r in keep], nxt[index]
            rows_left(rows)
        nxt = batch.step(nxt).argmax(dim=-1)
        steps += 1


def decode_skipped(model, prompts, masks, stopper, batch_size, bar) -> tuple[list[list[int]], dict[str, Any]]:
    """Held heads really skipped (:func:`~inactive_heads.pruning.skipping.skipping`): prompts that
    hold the same heads batched together (left-padded, prefilled once, one token per step, a
    finished row leaving its batch), each batch's cache holding only its kept KV heads. The
    resident KV bytes of every batch's cache tensors are measured after the prefill and at the
    end, beside the accountant's prediction for the same heads, rows and cached tokens."""
    groups: dict[bytes, list[int]] = {}
    for i in range(len(prompts)):
        groups.setdefault(masks[i].numpy().tobytes(), []).append(i)
    batches = []
    for members in groups.values():
        order = sorted(members, key=lambda i: (-len(prompts[i]), i))
        batches += [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    return _skipped_batches(model, prompts, batches, masks, stopper, bar)


def decode_decided(model, prompts, decider, stopper,
                    bar) -> tuple[list[list[int]], dict[str, Any], Bool[Tensor, "prompt layer head"]]:
    """:func:`decode_skipped` with the held heads decided inside the skipped prefill by a causal
    ``decider`` (``lookahead`` and ``held_heads``, e.g. :class:`~inactive_heads.prediction.PredictedAblation`),
    each layer's decision made before its heads would run: no separate decision pass. Each prompt
    runs alone (its set is known only after its prefill), then decodes holding what was decided.
    Returns the tokens, the skipping figures and the decided ``[prompt, layer, head]`` masks."""
    info = model_info(model)
    masks = torch.zeros((len(prompts), info.n_layers, info.n_heads), dtype=torch.bool)

    def record(rows: list[int], state) -> None:
        (row,) = rows
        masks[row] = torch.stack([state.decided[layer][0] for layer in range(info.n_layers)]).cpu()
        state.decider = None  # the decoding steps hold the prompt's decision

    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    generated, figures = _skipped_batches(model, prompts, [[i] for i in order], masks, stopper, bar,
                                          decider=decider, after_prefill=record)
    return generated, figures, masks


def _skipped_batches(model, prompts, batches: list[list[int]], masks, stopper, bar, *, decider=None,
                     after_prefill=None) -> tuple[list[list[int]], dict[str, Any]]:
    """Prefill and decode each batch of rows (all holding ``masks[rows[0]]``) inside
    :func:`~inactive_heads.pruning.skipping.skipping`, measuring the cache's bytes; with a
    ``decider`` the prefill decides the held heads and ``after_prefill(rows, state)`` fills ``masks``."""
    from ..pruning.accountant import held_fractions, model_shape, savings
    from ..pruning.skipping import cache_nbytes, release_packed, skipping

    shape = model_shape(model)
    dtype = next(model.parameters()).dtype
    cached = line_of(model).cached_decoder(model)
    device = model_device(model)
    generated: list[list[int]] = [[] for _ in prompts]
    figures = {"measured_prefill": 0, "predicted_prefill": 0, "measured_end": 0, "predicted_end": 0}

    def predicted(mask: Tensor, tokens: int, rows: int) -> int:
        heads = [tuple(p) for p in torch.nonzero(mask).tolist()]
        s = savings(shape, heads, seq_len=max(tokens, 1), dtype=dtype, kv_lengths=(tokens,))
        return rows * (s.kv_cache_bytes[tokens] - s.kv_cache_bytes_removed[tokens])

    for rows in batches:
        held = None if decider is not None else masks[rows[0]][None].expand(len(rows), -1, -1)
        with skipping(model, held, decider=decider, rule="skip") as state:
            tokens, pad = (t.to(device) for t in left_padded(prompts, rows))
            batch = cached(model, tokens, pad)
            if after_prefill is not None:
                after_prefill(rows, state)
            mask = masks[rows[0]]
            state.held = mask[None].expand(len(rows), -1, -1)
            figures["measured_prefill"] += cache_nbytes(batch.cache)
            figures["predicted_prefill"] += predicted(mask, tokens.shape[1], len(rows))

            def rows_left(rows: list[int], state=state, mask=mask) -> None:
                state.held = mask[None].expand(len(rows), -1, -1)

            last_rows, steps = _decode_batch(batch, rows, generated, stopper, bar, rows_left)
            figures["measured_end"] += cache_nbytes(batch.cache)
            figures["predicted_end"] += predicted(mask, tokens.shape[1] + steps, last_rows)
    release_packed(model)  # the gathered weights are not kept beside the model after the run
    fractions = held_fractions(shape, masks)
    info = {
        "kind": "measured",
        "batches": len(batches),
        "decided_in_prefill": decider is not None,
        "kv_bytes_measured_prefill": figures["measured_prefill"],
        "kv_bytes_predicted_prefill": figures["predicted_prefill"],
        "kv_bytes_measured_end": figures["measured_end"],
        "kv_bytes_predicted_end": figures["predicted_end"],
        "kv_bytes_measured_vs_predicted": (figures["measured_end"] / figures["predicted_end"]
                                           if figures["predicted_end"] else None),
        "query_heads_held_fraction": fractions["query_heads"],
        "kv_groups_held_fraction": fractions["kv_groups"],
    }
    return generated, info


def left_padded(prompts, rows: list[int]) -> tuple[Tensor, Tensor]:
    """Tokens and 1/0 mask of ``prompts[rows]``, left-padded to the longest."""
    width = max(len(prompts[i]) for i in rows)
    tokens = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        n = len(prompts[i])
        tokens[r, width - n:] = torch.tensor(prompts[i])
        mask[r, width - n:] = 1
    return tokens, mask


def held_savings(model, prompts: Sequence[Sequence[int]], masks: Bool[Tensor, "prompt layer head"],
                 n_generated: Sequence[int]) -> dict[str, Any]:
    """Estimated decode FLOPs and KV-cache bytes that held heads need not cost, per generated token.

    The accountant's counting rules (:mod:`inactive_heads.pruning.accountant`, one FLOP and KV
    model for the whole toolkit): at a decode step with ``keys`` keys a held query head would save
    its q and o projections and its attention (``4 · d_model · d_head + 4 · d_head · keys``), a KV
    head whose whole query group is held its k and v projections (``4 · d_model · d_head``) and
    its cache (``2 · d_head · bytes`` per token); the fraction is of the whole model's decode
    FLOPs at that step (MLPs and LM head included). "Estimated": the toolkit computes held heads
    and zeroes their outputs; nothing is skipped at run time.
    """
    from ..pruning.accountant import model_shape, removal_counts

    shape = model_shape(model)
    elem = torch.tensor([], dtype=next(model.parameters()).dtype).element_size()
    flops_saved = flops_all = kv_saved = 0.0
    tokens = 0
    for mask, prompt, n in zip(masks, prompts, n_generated):
        counts = removal_counts(shape, mask)
        held, kv_off = int(counts["query_heads"]), int(counts["kv_heads"])
        for k in range(1, n):  # decode step k feeds generated token k - 1 with len(prompt) + k keys
            keys = len(prompt) + k
            flops_saved += held * shape.q_head_flops(keys) + kv_off * shape.kv_head_flops()
            flops_all += shape.flops_per_token(keys)
        kv_saved += 2.0 * shape.d_head * elem * kv_off * n
        tokens += n
    kv_all = 2.0 * shape.d_head * elem * shape.n_layers * shape.n_kv_heads
    return {
        "kind": "estimated",
        "decode_flops_saved_per_token": flops_saved / tokens if tokens else 0.0,
        "decode_flops_saved_fraction": flops_saved / flops_all if flops_all else 0.0,
        "kv_cache_bytes_saved_per_token": kv_saved / tokens if tokens else 0.0,
        "kv_cache_bytes_per_token": kv_all,
        "kv_cache_saved_fraction": kv_saved / (kv_all * tokens) if tokens else 0.0,
    }
