"""Held heads really skipped: attention that leaves out the query heads a sequence holds.

The toolkit's ablations simulate inactive heads: every head is computed, then the held ones are
zeroed at ``hook_z``. Inside :func:`skipping` each attention module of the model runs
:func:`_skip_attention` instead, which per layer

- groups the batch's rows by the set of heads they hold at that layer, and per group projects
  queries with the **kept** heads' ``W_Q`` rows only, keys and values with the rows of the KV
  heads that some kept query head reads (a KV head is left out only when its whole query group is
  held: grouped-query attention shares it), attends, and applies only the kept heads' ``W_O``
  columns (plus ``b_O``): held heads cost nothing;
- or, where the accountant's FLOP model says that grouping costs more than it saves
  (:func:`choose`), computes every head and zeroes the held ones' outputs before ``W_O`` (the
  simulation's own arithmetic).

Everything else — embedding, norms, rotary tables, MLPs, the unembedding, TransformerLens's or
Hugging Face's KV-cache bookkeeping — is the model's own forward; rotary is applied with the
model's own function (``apply_rotary`` of a ``HookedTransformer``, Hugging Face's
``apply_rotary_pos_emb`` for a ``TransformerBridge``). So the logits equal the zeroing simulation
up to float rounding (the held heads' zero terms are not added; ≤ 1e-4 in fp32, tested).
Attention runs PyTorch's ``scaled_dot_product_attention`` with a boolean mask (causal, padding,
any cached keys); a padding query row that would see no key at all sees itself, so no NaN is
produced (its output is never read by a real token).

With a KV cache (prompt-held generation) every row of the batch must hold the same heads (the
generation groups its prompts so), the cache keeps only the kept KV heads' keys and values, and
the layer always runs skipped.

Hook points inside a skipped attention module do not fire (``hook_q``, ``hook_z``, ...): the held
heads' activations do not exist. Supported: Llama, Qwen2 and Mistral decoders (rotary, full
attention), on a ``HookedTransformer`` (TransformerLens 3.9) or a ``TransformerBridge`` (4).

Which heads are held, per row and layer, comes either from a fixed ``[batch, layer, head]`` mask
(a static set broadcast, or a decision made on each prompt) or from a *decider* object with
``lookahead: int`` and ``held_heads(layer, resid, attention_mask) -> Bool[batch, head]``, called
before layer ``layer``'s attention with the residual stream entering layer ``layer - lookahead``
(layer 0's input when that is negative), unnormalized, and the ``[batch, pos]`` 1/0 mask.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from weakref import WeakKeyDictionary

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.errors import UserError
from ..models.architectures import model_types_with
from ..runtime.fast_attention import fast_attention
from ..runtime.gated_mlp import swapped_forwards
from ..runtime.lines import line_of
from ..runtime.skip_kernels import Packed

RULES = ("auto", "skip", "dense")
"""How a layer runs: by the cost rule (:func:`choose`), always skipped, always dense with zeroing."""

# The cost rule (docs/skipping.md): a layer runs skipped when the accountant's FLOPs of the
# skipped groups, plus GROUP_OVERHEAD_FLOPS per group beyond the first and the copies of any
# weights not yet gathered, are at most SKIP_MARGIN of the dense layer's FLOPs.
SKIP_MARGIN = 0.97
GROUP_OVERHEAD_FLOPS = 2.0e6  # about 100 µs of a CPU core: one more group's dozen kernel calls

_SUPPORTED = "Llama, Qwen2 and Mistral decoders (rotary, full attention)"


@runtime_checkable
class Decider(Protocol):
    """What :func:`skipping` asks for held heads when no fixed mask is given."""

    lookahead: int

    def held_heads(self, layer: int, resid: Float[Tensor, "batch pos d_model"],
                   attention_mask: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch head"]: ...


def unsupported_reason(model) -> str | None:
    """Why :func:`skipping` cannot run on ``model`` (None: it can): its line's answer
    (:meth:`~inactive_heads.runtime.lines.base.ModelLine.skip_unsupported`)."""
    return line_of(model).skip_unsupported(model)


def check_supported(model) -> None:
    """A one-line :class:`UserError` unless :func:`skipping` runs on ``model``."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UserError(f"head skipping supports {_SUPPORTED} ({sorted(model_types_with('plain_decoder'))}); "
                        f"this model is not one: {reason}")


# ----------------------------------------------------------------------------------------------
# The heads of one layer, packed per kept set


def _layer_weights(model, layer: int) -> dict[str, Tensor | None]:
    """A layer's projections per head: ``q [head, d_head, d_model]``, ``k``/``v [kv_head, d_head,
    d_model]``, biases ``[head or kv_head, d_head]`` (or None), ``o [d_model, head, d_head]``,
    ``b_o [d_model]`` (or None)."""
    return line_of(model).skip_weights(model, layer)


def _pack(weights: dict[str, Tensor | None], kept_q: list[int], group: int) -> Packed:
    kept_kv = sorted({h // group for h in kept_q})
    counts = [sum(1 for h in kept_q if h // group == kv) for kv in kept_kv]
    q_idx = torch.tensor(kept_q, dtype=torch.long)
    kv_idx = torch.tensor(kept_kv, dtype=torch.long)

    def every(w, idx) -> bool:  # every head kept, in order: the weight itself serves, no copy
        return len(idx) == w.shape[0] and bool((idx == torch.arange(len(idx))).all())

    def rows(w, idx):
        if not every(w, idx):
            w = w.index_select(0, idx.to(w.device))
        return w.reshape(-1, w.shape[-1])

    def bias(b, idx):
        if b is None:
            return None
        return (b if every(b, idx) else b.index_select(0, idx.to(b.device))).reshape(-1)

    o = weights["o"]
    if not every(o.transpose(0, 1), q_idx):
        o = o.index_select(1, q_idx.to(o.device))
    return Packed(
        kept_q=q_idx, kept_kv=kv_idx,
        uniform=len(set(counts)) <= 1, counts=tuple(counts), d_head=weights["q"].shape[1],
        w_q=rows(weights["q"], q_idx), b_q=bias(weights["b_q"], q_idx),
        w_k=rows(weights["k"], kv_idx), b_k=bias(weights["b_k"], kv_idx),
        w_v=rows(weights["v"], kv_idx), b_v=bias(weights["b_v"], kv_idx),
        w_o=o.reshape(o.shape[0], -1).contiguous(), b_o=weights["b_o"],
    )


# ----------------------------------------------------------------------------------------------
# The cost rule


@dataclass
class LayerChoice:
    """How one layer ran in one call: ``"skip"`` (rows grouped by held set) or ``"dense"``."""

    layer: int
    mode: str
    groups: int
    held_fraction: float


def choose(shape, held: Bool[Tensor, "batch head"], n_new: int, n_keys: int, unpacked: int,
           rule: str = "auto") -> str:
    """``"skip"`` or ``"dense"`` for one layer (module docstring; docs/skipping.md, "The cost rule").

    ``shape``: the accountant's :class:`~inactive_heads.pruning.accountant.ModelShape`; ``held``
    the batch's held heads at the layer; ``n_new`` the tokens per row computed now, ``n_keys`` the
    keys the last of them attends to; ``unpacked`` how many of the batch's distinct held sets have
    no gathered weights yet. Per token, a query head costs ``shape.q_head_flops(a)`` (``a`` the
    mean keys attended) and a KV head ``shape.kv_head_flops()``. Dense: every row, every head.
    Skipped: each group's rows with its kept heads, plus :data:`GROUP_OVERHEAD_FLOPS` for every
    group beyond the first and, per unpacked set, the weight elements its gather copies (counted
    one FLOP each). Skipped when that is at most :data:`SKIP_MARGIN` of dense."""
    if rule != "auto":
        return rule
    b = held.shape[0]
    attended = n_keys - (n_new - 1) / 2
    q, kv = shape.q_head_flops(attended), shape.kv_head_flops()
    group = shape.group_size
    dense = b * n_new * (shape.n_heads * q + shape.n_kv_heads * kv)
    sets, counts = torch.unique(held, dim=0, return_counts=True)
    kept_q = (~sets).sum(dim=1).double()
    kept_kv = (~sets).view(sets.shape[0], shape.n_kv_heads, group).any(dim=2).sum(dim=1).double()
    skipped = float((counts.double() * n_new * (kept_q * q + kept_kv * kv)).sum())
    skipped += GROUP_OVERHEAD_FLOPS * (sets.shape[0] - 1)
    if unpacked:
        mean_kept = float((2 * kept_q + 2 * kept_kv).mean())
        skipped += unpacked * mean_kept * shape.d_model * shape.d_head
    return "skip" if skipped <= SKIP_MARGIN * dense else "dense"


# ----------------------------------------------------------------------------------------------
# The state of one skipping block


@dataclass
class SkipState:
    """What :func:`skipping` runs with: the held heads (``held`` ``[batch, layer, head]``, set per
    batch) or a ``decider``, the rule, and what each layer did in the last calls (``choices``)."""

    model: Any
    shape: Any
    held: Tensor | None = None
    decider: Any = None
    attention_mask: Tensor | None = None  # [batch, pos] 1/0 of the current call (for a decider)
    rule: str = "auto"
    choices: list[LayerChoice] = field(default_factory=list)
    resid: dict[int, Tensor] = field(default_factory=dict)
    decided: dict[int, Tensor] = field(default_factory=dict)  # the decider's last [batch, head] per layer
    _masks: list = field(default_factory=list, repr=False, init=False)

    def by_groups(self, layer: int, held: Tensor, n: int, n_keys: int, cached: bool, run, x: Tensor) -> Tensor:
        """The layer's output from ``run(rows, packed, zero)`` per group of rows (:func:`_by_groups`):
        what a line's skipping attention forward calls."""
        return _by_groups(self, layer, held, n, n_keys, cached, run, x)

    def allowed(self, mask, rows, n: int, n_keys: int, build):
        """``build()`` once per mask object, rows and sizes (every layer of a call gets the same mask)."""
        key = (n, n_keys, None if rows is None else tuple(rows.tolist()))
        for m, k, value in self._masks:
            if m is mask and k == key:
                return value
        value = build()
        self._masks = [(mask, key, value)] + self._masks[:7]
        return value

    def held_at(self, layer: int, batch: int, device) -> Tensor:
        if self.decider is not None:
            source = max(0, layer - int(self.decider.lookahead))
            mask = self.attention_mask
            resid = self.resid[source]
            if mask is None:
                mask = torch.ones(resid.shape[:2], dtype=torch.long, device=resid.device)
            flags = torch.as_tensor(self.decider.held_heads(layer, resid, mask), dtype=torch.bool)
            if tuple(flags.shape) != (batch, self.shape.n_heads):
                raise UserError(f"the decider's held_heads({layer}, ...) must be [batch, head] = "
                                f"[{batch}, {self.shape.n_heads}]; got {tuple(flags.shape)}")
            self.decided[layer] = flags
            return flags.to(device)
        if self.held is None:
            return torch.zeros((batch, self.shape.n_heads), dtype=torch.bool, device=device)
        if self.held.shape[0] != batch:
            raise RuntimeError(f"skipping: held heads for {self.held.shape[0]} rows, batch of {batch}")
        return self.held[:, layer].to(device)

    def packed(self, layer: int, kept: list[int]) -> Packed:
        """The layer's weights gathered for ``kept`` (kept per model across blocks, re-gathered
        when a source weight changed)."""
        store = _PACKED.setdefault(self.model, {})
        key = (layer, tuple(kept))
        weights = _layer_weights(self.model, layer)
        stamp = tuple((t.data_ptr(), _version(t)) for t in weights.values() if t is not None)
        hit = store.get(key)
        if hit is None or hit[1] != stamp:
            store.pop(key, None)
            packed = _pack(weights, kept, self.shape.group_size)
            size = _nbytes(packed, weights)
            budget = _packed_budget(self.shape, weights["q"].element_size())
            while store and sum(entry[2] for entry in store.values()) + size > budget:
                store.pop(next(iter(store)))  # the oldest first
            hit = store[key] = (packed, stamp, size)
        return hit[0]

    def is_packed(self, layer: int, kept: tuple[int, ...]) -> bool:
        return (layer, kept) in _PACKED.get(self.model, {})


def _nbytes(packed: Packed, weights: dict[str, Tensor | None]) -> int:
    """Bytes the gathered set holds of its own (a weight kept whole is the model's, not a copy)."""
    own = {t.untyped_storage().data_ptr() for t in weights.values() if t is not None}
    return sum(t.numel() * t.element_size() for t in vars(packed).values()
               if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in own)


def _packed_budget(shape, element_size: int) -> int:
    """Bytes the gathered sets of one model may hold at once: one copy of its attention
    projections (an 8B model's 2.7 GB in bfloat16), so a run holding many different sets never
    grows past that; the oldest set goes first."""
    per_layer = shape.d_model * shape.d_head * 2 * (shape.n_heads + shape.n_kv_heads)
    return shape.n_layers * per_layer * element_size


def release_packed(model) -> None:
    """Drop the weights gathered for ``model``'s held sets (a skipped generation does at its end:
    what it gathered is not kept beside the model afterwards)."""
    _PACKED.pop(model, None)


def _version(t: Tensor) -> int:
    """A tensor's in-place edit counter (an inference tensor has none: -1)."""
    try:
        return t._version
    except RuntimeError:
        return -1


# model -> {(layer, kept heads): (gathered weights, the source weights' pointers and versions, bytes)},
# at most _packed_budget bytes per model
_PACKED: "WeakKeyDictionary[object, dict]" = WeakKeyDictionary()
_CHOICES_KEPT = 1024  # the last layer choices a SkipState keeps


@contextmanager
def skipping(model, held: Bool[Tensor, "batch layer head"] | None = None, *, decider: Decider | None = None,
             rule: str = "auto") -> Iterator[SkipState]:
    """Inside the block, ``model``'s attention skips held heads (module docstring). Yields the
    :class:`SkipState`; set ``state.held`` (``[batch, layer, head]``) per batch, or pass a
    ``decider``. The model's other modules run as in the toolkit's fast form
    (:func:`~inactive_heads.runtime.fast_attention.fast_attention`)."""
    check_supported(model)
    if rule not in RULES:
        raise UserError(f"rule must be one of {', '.join(map(repr, RULES))}, got {rule!r}")
    if held is not None and decider is not None:
        raise UserError("pass held heads or a decider, not both")
    if decider is not None and (not hasattr(decider, "held_heads") or not isinstance(
            getattr(decider, "lookahead", None), int) or decider.lookahead < 0):
        raise UserError("a decider needs held_heads(layer, resid, attention_mask) and an int lookahead >= 0")
    from .accountant import model_shape

    state = SkipState(model=model, shape=model_shape(model), held=held, decider=decider, rule=rule)
    line = line_of(model)
    forwards = {}
    for layer, block in enumerate(model.blocks):
        forwards[block.attn] = _bind(line.skip_attention, block.attn, state, layer)
        if decider is not None:
            forwards[block] = _recorder(block, state, layer)
    with torch.no_grad(), fast_attention(model), swapped_forwards(forwards), line.skip_cache_offset(model):
        yield state


def _bind(forward, module, state: SkipState, layer: int):
    def bound(*args, **kwargs):
        return forward(module, state, layer, *args, **kwargs)

    return bound


def _recorder(block, state: SkipState, layer: int):
    """The block's own forward, after keeping the residual stream entering it (for a decider)."""
    own = type(block).forward.__get__(block)

    def forward(*args, **kwargs):
        state.resid[layer] = args[0] if args else kwargs["hidden_states"]
        return own(*args, **kwargs)

    return forward


def _by_groups(state: SkipState, layer: int, held: Tensor, n: int, n_keys: int, cached: bool, run, x: Tensor):
    """Run ``run(rows, packed, zero)`` per group of rows holding the same heads (skipped), or once
    over every head with the held ones zeroed (dense); the layer's ``[batch, pos, d_model]`` output."""
    b = held.shape[0]
    sets, inverse = torch.unique(held.cpu(), dim=0, return_inverse=True)
    if cached and sets.shape[0] > 1:
        raise UserError(f"head skipping with a KV cache needs one held set for the whole batch, got {sets.shape[0]}; "
                        "generate(..., skip=True) batches prompts by held set, or call the model with use_cache=False")
    all_heads = list(range(state.shape.n_heads))
    kept_sets = [tuple(int(h) for h in torch.nonzero(~s).flatten()) for s in sets]
    unpacked = sum(not state.is_packed(layer, k) for k in kept_sets)
    mode = "skip" if cached else choose(state.shape, held.cpu(), n, n_keys, unpacked, state.rule)
    state.choices.append(LayerChoice(layer, mode, int(sets.shape[0]), float(held.float().mean())))
    del state.choices[:-_CHOICES_KEPT]
    if mode == "dense":
        zero = held if bool(held.any()) else None
        return run(None, state.packed(layer, all_heads), zero)
    if sets.shape[0] == 1:
        return run(None, state.packed(layer, list(kept_sets[0])), None)
    out = None
    for g, kept in enumerate(kept_sets):
        rows = torch.nonzero(inverse == g).flatten().to(x.device)
        part = run(rows, state.packed(layer, list(kept)), None)
        if out is None:
            out = part.new_empty((b, *part.shape[1:]))
        out[rows] = part
    return out


# ----------------------------------------------------------------------------------------------
# Public entry points


def held_mask(model, held, batch: int) -> Bool[Tensor, "batch layer head"]:
    """``held`` as a ``[batch, layer, head]`` mask: a ``[layer, head]`` mask broadcast, a
    ``[batch, layer, head]`` one, or (layer, head) pairs / a ``HeadSet`` (the same for every row)."""
    from .accountant import _mask, model_shape

    shape = model_shape(model)
    if held is None:
        return torch.zeros((batch, shape.n_layers, shape.n_heads), dtype=torch.bool)
    if not torch.is_tensor(held):
        held = _mask(shape, held)  # (layer, head) pairs, checked against the model as the accountant does
    held = held.to(torch.bool).cpu()
    if held.ndim == 2:
        held = held[None].expand(batch, -1, -1)
    if tuple(held.shape) != (batch, shape.n_layers, shape.n_heads):
        raise UserError(f"held heads must be [layer, head] or [batch, layer, head] = [{batch}, {shape.n_layers}, "
                        f"{shape.n_heads}]; got {tuple(held.shape)}")
    return held


def skip_logits(model, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None,
                *, held=None, decider: Decider | None = None, rule: str = "auto") -> Float[Tensor, "batch pos vocab"]:
    """Logits of one forward pass in which held heads are not computed (module docstring).

    ``held``: a ``[layer, head]`` or ``[batch, layer, head]`` boolean mask, or (layer, head) pairs;
    or ``decider`` (held heads decided per layer from the residual stream). ``attention_mask``:
    1 = real token, left or right padding. ``rule``: ``"auto"`` (the cost rule, :func:`choose`),
    ``"skip"`` or ``"dense"`` (every head computed, the held ones zeroed). Equal to the zeroing
    simulation within float rounding."""
    b = tokens.shape[0]
    mask = held_mask(model, held, b) if decider is None else None
    with skipping(model, mask, decider=decider, rule=rule) as state:
        state.attention_mask = attention_mask
        extra = line_of(model).skip_forward_kwargs()
        if attention_mask is None:
            return model(tokens, **extra)
        return model(tokens, attention_mask=attention_mask, **extra)


def check_group_fraction(value, name: str = "hold_groups") -> float:
    """The group-level rule's fraction as a float, or a one-line error naming ``name`` unless it
    is a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"{name} must be a fraction in (0, 1] (e.g. 0.5: hold a KV group when half its query "
                        f"heads are held), got {value!r}")
    return float(value)


def group_level(held: Bool[Tensor, "*batch layer head"], n_kv_heads: int,
                min_fraction: float = 1.0) -> Bool[Tensor, "*batch layer head"]:
    """The group-level rule under grouped-query attention: a KV group whose held share of query
    heads is at least ``min_fraction`` is held whole (its KV head then freed); other groups keep
    their held heads as they are. ``min_fraction=1.0`` changes nothing; ``0.5`` holds a group
    when at least half its heads are held (more heads zeroed: an accuracy cost to measure)."""
    min_fraction = check_group_fraction(min_fraction, "min_fraction")
    n_heads = held.shape[-1]
    if n_heads % n_kv_heads:
        raise UserError(f"{n_heads} heads do not split into {n_kv_heads} KV groups")
    groups = held.reshape(*held.shape[:-1], n_kv_heads, n_heads // n_kv_heads)
    whole = groups.float().mean(dim=-1, keepdim=True) >= min_fraction - 1e-9
    return (groups | whole).reshape(held.shape)


def cache_nbytes(cache) -> int:
    """Resident bytes of a KV cache's key and value tensors: a TransformerLens cache (its entries'
    ``past_keys``/``past_values``) or a Hugging Face ``DynamicCache`` (its layers' ``keys``/``values``)."""
    entries = getattr(cache, "entries", None)
    if entries is not None:
        return sum(e.past_keys.nbytes + e.past_values.nbytes for e in entries)
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if torch.is_tensor(t):
                total += t.nbytes
    return total
