"""Faster attention for a ``HookedTransformer``, installed per model and only inside a ``with`` block.

(A TransformerLens 4 ``TransformerBridge`` gets the same forms, inside the same block, from
:mod:`inactive_heads.runtime.bridge_attention`; what follows describes the ``HookedTransformer``.)

TransformerLens computes every layer's attention the slow, fully observable way: the full
``[batch, head, query, key]`` score tensor is divided by √d, masked with ``torch.where`` against a
causal-and-padding mask rebuilt at every layer, soft-maxed, NaN-cleaned and multiplied by values
expanded per query head (GQA). When nothing reads ``hook_pattern`` or ``hook_attn_scores`` that
work is not needed: :func:`fast_attention` swaps, on each attention module of *this* model and
only while the block runs, a forward that

- computes ``q``, ``k``, ``v`` and rotary with TransformerLens's own methods, so ``hook_q``,
  ``hook_k``, ``hook_v``, ``hook_rot_q``, ``hook_rot_k`` fire exactly as before;
- with ``fused=True``, runs PyTorch's fused ``scaled_dot_product_attention`` (causal + padding
  mask, grouped KV heads without copies) when no hook is attached to that layer's
  ``hook_pattern``/``hook_attn_scores``; where ``hook_pattern`` is hooked only by read-only hooks
  the toolkit installed (:mod:`inactive_heads.runtime.hook_registry`: its score and ablation hooks)
  they get the eager pattern and z still comes from the fused kernel, so reading the pattern never
  changes the numbers;
- with ``fused=False`` (the exact form), computes the pattern with TransformerLens's operations —
  one additive mask per forward instead of ``where`` against a rebuilt one, grouped heads by a
  reshape instead of copies, no NaN pass, and a block of query rows at a time so the scale, mask
  and softmax passes stay in cache (each row's arithmetic is unchanged: logits equal
  TransformerLens's to the bit on SmolLM2) — and z from it;
- hands a hook that may change the pattern (not marked read-only) the whole pattern and takes z
  from what it returns, as TransformerLens does;
- fires ``hook_z`` on ``[batch, pos, head, d_head]`` and applies ``W_O`` as before, so ablation
  at ``hook_z`` is unchanged. A plain gated MLP runs without TransformerLens's per-call weight
  copies (:mod:`~inactive_heads.runtime.gated_mlp`): weights in place with the fused kernel, each
  transposed copy made once per weight in the exact form (on CPU), so that arithmetic stays
  TransformerLens's.

A layer with a hook on ``hook_attn_scores``, a KV cache or left padding runs TransformerLens's own
forward; so does every layer of a model outside the allow-list (:func:`unsupported_reason`: the
configurations this forward implements; anything else, including a config field it does not know,
gets a one-line warning once). The first time a model runs in a form, each layer's output on that
batch is checked against TransformerLens's own forward (:class:`_Check`); a mismatch beyond float
rounding switches the model to TransformerLens's forward. Results equal the eager path up to float
rounding (≤1e-4 on logits in fp32). A nested block must use the same form. Leaving the block
restores the modules; other models are never touched.
"""

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MethodType
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.errors import UserError
from .gated_mlp import exact_forward, fused_forward, swapped_forwards
from .grouped import grouped_scores, in_row_blocks, weighted
from .hook_registry import hooked as _hooked
from .hook_registry import only_read_only as _read_only
from .hook_registry import read_only  # noqa: F401  (the mark the toolkit's hooks carry; re-exported)
from .lines.base import line_of


def unsupported_reason(model) -> str | None:
    """Why the fast forward does not run on ``model`` (None: it does): its line's allow-list
    (:meth:`~inactive_heads.runtime.lines.base.ModelLine.attention_unsupported`)."""
    return line_of(model).attention_unsupported(model)


def _unsupported(model) -> str | None:
    """Why neither forward of :func:`fast_attention` runs on ``model``: its line's allow-list."""
    return unsupported_reason(model)


def supports_fast_attention(model) -> bool:
    """True when :func:`fast_attention` runs its own forward on ``model``: a ``HookedTransformer``
    (see :func:`unsupported_reason`) or a ``TransformerBridge``
    (:func:`~inactive_heads.runtime.bridge_attention.unsupported_reason`)."""
    return _unsupported(model) is None


_WARNED: "WeakKeyDictionary[object, set[str]]" = WeakKeyDictionary()


def _warn_once(model, message: str) -> None:
    """One warning line per model and message."""
    seen = _WARNED.setdefault(model, set())
    if message not in seen:
        seen.add(message)
        warnings.warn(message, stacklevel=4)


@dataclass
class PrefixKV:
    """Rotated keys and values of one shared prefix, per layer (``[1, prefix, kv_head, d_head]``)."""

    length: int
    keys: list[Tensor | None] = field(default_factory=list)
    values: list[Tensor | None] = field(default_factory=list)


class _State:
    """Per-model state of the fast forward: one mask per forward pass, and an optional prefix.

    ``capture`` (a :class:`PrefixKV` being filled) makes each layer store its keys and values;
    ``prefix`` (a filled one) makes each layer attend to those before the given tokens, which then
    sit at positions ``prefix.length, prefix.length + 1, ...``.
    """

    def __init__(self, layers: dict[int, int], check: "_Check | None" = None):
        self.layers = layers  # id(attention or MLP module) -> layer index
        self.check = check if check is not None else _Check()
        self.capture: PrefixKV | None = None
        self.prefix: PrefixKV | None = None
        self.fused = True  # False: z from the eager pattern wherever hook_pattern is hooked
        # Set while a layer's attention output is already known (the prefix's z with some heads
        # zeroed): the layer skips q/k/v and attention and applies W_O to it.
        self.z_override: Tensor | None = None
        self._masks: list[tuple] = []  # a few recent (key, value) pairs of masks()

    def masks(self, attention_mask: Tensor | None, q_len: int, device, dtype):
        """(bool mask or None, additive mask or None, usable); None masks mean "plain causal"."""
        p = self.prefix.length if self.prefix is not None else 0
        key = (q_len, p, device, dtype)
        for mask, k, value in self._masks:
            if mask is attention_mask and k == key:
                return value
        if attention_mask is not None:
            m = attention_mask.bool()
            right_padded = bool(m[:, 0].all()) and bool((m[:, 1:] <= m[:, :-1]).all())
        if attention_mask is None or (p == 0 and bool(m.all())):
            value = (None, None, True)
        elif not right_padded:
            value = (None, None, False)  # left or inner padding: leave it to TransformerLens
        else:
            allowed = allowed_keys(m.to(device), q_len, p)
            additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
            additive.masked_fill_(~allowed, float("-inf"))
            value = (allowed, additive, True)
        # A prefix-reusing pass alternates between the prefix's mask and its batch's: keep a few.
        self._masks = [(attention_mask, key, value)] + self._masks[:3]
        return value


def allowed_keys(valid: Bool[Tensor, "batch pos"], n: int, p: int = 0) -> Bool[Tensor, "batch 1 pos keys"]:
    """Which keys each query of a right-padded batch sees: every one of ``p`` cached prefix keys,
    then the causal keys of its own ``n`` positions that are not padding."""
    causal = torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    allowed = causal[None, None] & valid[:, None, None, :]
    if p:
        seen = torch.ones((valid.shape[0], 1, n, p), dtype=torch.bool, device=valid.device)
        allowed = torch.cat([seen, allowed], dim=-1)
    return allowed


def _fused(self, qh, kh, vh, allowed, group: int) -> Tensor:
    if allowed is None and kh.shape[2] != qh.shape[2]:
        raise RuntimeError("a reused prefix needs an attention mask; pass attention_mask")
    return F.scaled_dot_product_attention(
        qh, kh.to(qh.dtype), vh.to(qh.dtype), attn_mask=allowed, is_causal=allowed is None,
        scale=1.0 / self.attn_scale, enable_gqa=group > 1,
    )


# The exact path computes attention in blocks of query rows of about this many score elements, so
# the scale, mask and softmax passes stay in cache (each row's numbers are unchanged by blocking).
_BLOCK_ELEMENTS = 1 << 21


def _attention(
    self, q: Float[Tensor, "batch pos head d_head"], k: Tensor, v: Tensor, state: _State, attention_mask
) -> Float[Tensor, "batch pos head d_head"]:
    """z for one layer: from the fused kernel (``state.fused``) or from the eager pattern, computed
    in blocks of query rows. Where ``hook_pattern`` is hooked the hooks get the whole
    ``[batch, head, query, key]`` pattern; z comes from what they return unless every hook is
    marked :func:`read_only` (then a run that only reads the pattern gives the same z, to the bit,
    as one that does not read it)."""
    n, n_heads, n_keys = q.shape[1], q.shape[2], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, head, pos, d]
    allowed, additive, _ = state.masks(attention_mask, n, q.device, q.dtype)
    group = n_heads // kh.shape[1]
    hooked = _hooked(self.hook_pattern)
    if state.fused and not hooked:
        return _fused(self, qh, kh, vh, allowed, group).transpose(1, 2)
    if additive is None and n_keys != n:
        raise RuntimeError("a reused prefix needs an attention mask; pass attention_mask")
    if hooked and not _read_only(self.hook_pattern):
        # A hook may change the pattern: hand it the whole pattern first, then use what it returns.
        pattern = self.hook_pattern(_eager_pattern(self, qh, kh, additive, 0, n))
        return weighted(pattern, vh).transpose(1, 2)
    pattern, z = in_row_blocks(lambda start, stop: _eager_pattern(self, qh, kh, additive, start, stop), vh,
                               n_heads, n, keep_pattern=hooked, keep_z=not state.fused,
                               block_elements=_BLOCK_ELEMENTS, dtype=q.dtype)
    if hooked:
        self.hook_pattern(pattern)  # read-only hooks: they see the whole pattern and change nothing
    if z is None:
        z = _fused(self, qh, kh, vh, allowed, group)
    return z.transpose(1, 2)


def _eager_pattern(self, qh, kh, additive, start: int, stop: int) -> Tensor:
    """Softmax attention weights of query rows ``start:stop``, ``[batch, head, rows, key]``, with
    TransformerLens's operations: grouped product (query heads of one KV head stacked along the
    query axis, no K/V copies), divided by the scale after the product, masked, soft-maxed."""
    m, n_keys = stop - start, kh.shape[2]
    scores = grouped_scores(qh, kh, start, stop) / self.attn_scale
    if additive is None:  # plain causal: row i sees keys 0..start+i
        causal = torch.ones(m, n_keys, dtype=torch.bool, device=qh.device).triu(start + 1)
        scores = scores.masked_fill(causal, float("-inf"))
    else:
        scores = scores + additive[:, :, start:stop]
    return torch.softmax(scores, dim=-1)


def _fast_forward(
    self,
    query_input,
    key_input,
    value_input,
    past_kv_cache_entry=None,
    additive_attention_mask=None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    position_bias=None,
    *,
    _state: _State,
):
    if _state.z_override is not None:
        return _output(self, _state.z_override)
    prefix = _state.prefix
    usable = attention_mask is None or _state.masks(
        attention_mask, attention_mask.shape[1], attention_mask.device, self.W_Q.dtype
    )[2]
    own = (
        past_kv_cache_entry is not None
        or additive_attention_mask is not None
        or position_bias is not None
        or _hooked(self.hook_attn_scores)
        or not usable
    )
    layer = _state.layers[id(self)]
    if not own and prefix is None and ("attn", layer) not in _state.check.done and not _state.check.failed:
        # First use of this layer in this form: a corner of one batch (causal: its first positions
        # depend on nothing after them) against TransformerLens's own forward.
        qi, ki, vi, am = (_corner(t) for t in (query_input, key_input, value_input, attention_mask))
        _state.check.compare(self, ("attn", layer), lambda: _compute(self, qi, ki, vi, _state, am, capture=False),
                             lambda: type(self).forward(self, qi, ki, vi, attention_mask=am), am)
    if own or _state.check.failed:
        if prefix is not None or _state.capture is not None:
            raise RuntimeError("prefix reuse needs right-padded batches, no hook on hook_attn_scores and a model "
                               "the fast forward agrees with; run without reuse_prefix")
        return type(self).forward(self, query_input, key_input, value_input, past_kv_cache_entry,
                                  additive_attention_mask, attention_mask, position_bias)
    return _compute(self, query_input, key_input, value_input, _state, attention_mask)


def _compute(self, query_input, key_input, value_input, _state: _State, attention_mask, *,
             capture: bool = True) -> Float[Tensor, "batch pos d_model"]:
    """The fast forward's output for one attention layer (``capture=False``: leave the prefix
    being captured alone, for the first-use check)."""
    prefix = _state.prefix
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    offset = prefix.length if prefix is not None else 0
    if self.cfg.positional_embedding_type == "rotary":
        # Right padding: real tokens sit at positions offset, offset + 1, ... (pads never reach them).
        q = self.hook_rot_q(self.apply_rotary(q, offset, None))
        k = self.hook_rot_k(self.apply_rotary(k, offset, None))
    layer = _state.layers[id(self)]
    if capture and _state.capture is not None:
        _state.capture.keys.append(k)
        _state.capture.values.append(v)
    if prefix is not None:
        b = q.shape[0]
        k = torch.cat([prefix.keys[layer].expand(b, -1, -1, -1).to(k.dtype), k], dim=1)
        v = torch.cat([prefix.values[layer].expand(b, -1, -1, -1).to(v.dtype), v], dim=1)
    if attention_mask is not None:
        attention_mask = attention_mask.to(q.device)
    return _output(self, self.hook_z(_attention(self, q, k, v, _state, attention_mask)))


def _output(self, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
    """The attention block's output ``z W_O + b_O``, one matrix product over all heads."""
    w_o = self.W_O
    z_flat = z.reshape(z.shape[0] * z.shape[1], -1).to(w_o.dtype)
    out = torch.addmm(self.b_O.to(z.device), z_flat, w_o.reshape(-1, w_o.shape[-1]).to(z.device))
    return out.view(z.shape[0], z.shape[1], -1)


# ----------------------------------------------------------------------------------------------
# The first-use check

# How far the fast forward may be from TransformerLens's own on one layer's output, relative to
# that output's largest magnitude: float rounding (the fused kernel adds in another order), far
# below what a missing feature (a scale, a cap, a mask) does.
_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


@contextmanager
def _hooks_off(module):
    """No hook of ``module``'s hook points fires inside the block (for the reference forward)."""
    from transformer_lens.hook_points import HookPoint

    points = [m for m in module.modules() if isinstance(m, HookPoint)]
    saved = [(p, p._forward_hooks, p._forward_pre_hooks) for p in points]
    try:
        for p in points:
            p._forward_hooks, p._forward_pre_hooks = type(p._forward_hooks)(), type(p._forward_pre_hooks)()
        yield
    finally:
        for p, fwd, pre in saved:
            p._forward_hooks, p._forward_pre_hooks = fwd, pre


# The first-use check runs on at most this many rows and first positions of the batch: enough for
# every feature of the forward to show, without a second full forward of a large first batch.
_CHECK_ROWS, _CHECK_POSITIONS = 4, 64


def _corner(t: Tensor | None) -> Tensor | None:
    """The first rows and positions of a ``[batch, pos, ...]`` tensor (the first-use check's sample)."""
    return None if t is None else t[:_CHECK_ROWS, :_CHECK_POSITIONS]


class _Check:
    """First-use check of one model in one form: each layer's attention (and patched MLP) output,
    the first time it runs, against TransformerLens's own forward (a bridge's: its own) on the same
    inputs (the batch's first ``rows`` rows and ``positions`` positions, :func:`_corner`), with no
    hook firing in either. The numbers the run then uses are computed afresh, as if no check had run."""

    rows, positions = _CHECK_ROWS, _CHECK_POSITIONS

    def __init__(self, model=None, form: str = ""):
        self.model_name = getattr(getattr(model, "cfg", None), "model_name", type(model).__name__)
        self.form = form
        self.done: set[tuple[str, int]] = set()
        self.failed = False

    def compare(self, module, where: tuple[str, int], ours, reference, attention_mask=None) -> None:
        with torch.no_grad(), _hooks_off(module):
            got, ref = ours(), reference()
        rows = attention_mask.bool().to(ref.device) if attention_mask is not None else slice(None)
        got, ref = got.to(ref.dtype)[rows], ref[rows]
        finite = ref[torch.isfinite(ref)]
        tol = _TOLERANCE.get(ref.dtype, 5e-2) * max(1.0, float(finite.abs().max()) if finite.numel() else 1.0)
        # Equal values (infinities included) and NaN in both agree; NaN in one only does not.
        apart = torch.where((got == ref) | (got.isnan() & ref.isnan()), 0.0, (got - ref).abs())
        diff = float(apart.max()) if apart.numel() else 0.0
        if not diff <= tol:
            self.failed = True
            warnings.warn(
                f"fast_attention: {self.model_name}: the {self.form} form's {where[0]} output at layer {where[1]} "
                f"differs from TransformerLens's own forward by {diff:.3g} (tolerance {tol:.3g}); using "
                "TransformerLens's forward for this model", stacklevel=6)
            return
        self.done.add(where)


_CHECKS: "WeakKeyDictionary[object, dict[str, _Check]]" = WeakKeyDictionary()


# ----------------------------------------------------------------------------------------------
# The context manager


@dataclass
class _Active:
    form: str
    on: bool
    state: "_State | None" = None
    depth: int = 1


# model -> the fast_attention block running on it (the toolkit's own record; nothing is stored on the model)
_ACTIVE: "WeakKeyDictionary[object, _Active]" = WeakKeyDictionary()


@contextmanager
def fast_attention(model, enabled: bool = True, *, fused: bool = True):
    """Use the fast attention forward on ``model`` inside the block; yields whether it is on.

    ``fused=False`` computes every layer's pattern with the grouped eager path instead of the
    fused kernel: a little slower, and the same arithmetic as TransformerLens (bit-identical
    logits on SmolLM2). ``enabled=False`` keeps TransformerLens's own forward.

    >>> with fast_attention(model):                # doctest: +SKIP
    ...     logits = model(tokens, attention_mask=mask)

    A configuration outside the allow-list (:func:`unsupported_reason`) runs unchanged, with a
    one-line warning once per model (yields False); a ``TransformerBridge`` runs
    :func:`~inactive_heads.runtime.bridge_attention.bridge_forward` where its allow-list admits it,
    else its own forward, without a warning. The first time a
    model runs in a form, each layer's output on that batch is checked against TransformerLens's
    own forward; a mismatch beyond float rounding switches the model back to TransformerLens's
    forward, with a warning. A nested block on the same model must ask for the same form (it then
    runs inside the outer one); another form is a :class:`UserError`.
    """
    form = "eager" if not enabled else "fast" if fused else "exact"
    active = _ACTIVE.get(model)
    if active is not None:
        if active.form != form:
            raise UserError(
                f"fast_attention: this model already runs the '{active.form}' attention form in an enclosing "
                f"block; a nested block asked for '{form}': use one form per model at a time"
            )
        active.depth += 1
        try:
            yield active.on
        finally:
            active.depth -= 1
        return
    line = line_of(model)
    reason = line.attention_unsupported(model) if enabled else None
    # A bridge outside its allow-list (Q/K norms, soft caps, joint QKV: Gemma, Phi-3, ...) runs
    # its own forward as it always did; nothing to warn about (supports_fast_attention says which).
    if reason is not None and line.warns_when_unsupported:
        _warn_once(model, f"fast_attention: {reason}; running TransformerLens's own attention forward")
    if not enabled or reason is not None:
        _ACTIVE[model] = _Active(form, False)
        try:
            yield False
        finally:
            _ACTIVE.pop(model, None)
        return
    checks = _CHECKS.setdefault(model, {})
    check = checks.get(form) or checks.setdefault(form, _Check(model, form))
    attns = [block.attn for block in model.blocks]
    layers = {id(attn): layer for layer, attn in enumerate(attns)}
    mlps = [block.mlp for block in model.blocks if line.plain_gated_mlp(block.mlp)]  # none on a bridge
    layers.update({id(block.mlp): layer for layer, block in enumerate(model.blocks)})
    state = _State(layers, check)
    state.fused = fused
    patched = {module: _bound(line.attention_forward, module, state) for module in attns}
    mlp_forward = _checked_gated_mlp if fused else exact_forward
    patched.update({module: _bound(mlp_forward, module, state) for module in mlps})
    _ACTIVE[model] = _Active(form, True, state)
    try:
        with swapped_forwards(patched):
            yield True
    finally:
        _ACTIVE.pop(model, None)


def _bound(forward, module, state: _State):
    """``forward`` as ``module``'s forward, with the block's state."""
    method = MethodType(forward, module)

    def bound(*args, **kwargs):
        return method(*args, _state=state, **kwargs)

    return bound


def _checked_gated_mlp(self, x: Float[Tensor, "batch pos d_model"], *,
                       _state: _State) -> Float[Tensor, "batch pos d_model"]:
    """The fused form's gated MLP (:func:`~inactive_heads.runtime.gated_mlp.fused_forward`), checked
    once per layer against TransformerLens's own forward like the attention."""
    where = ("mlp", _state.layers[id(self)])
    if where not in _state.check.done and not _state.check.failed:
        corner = _corner(x)
        _state.check.compare(self, where, lambda: fused_forward(self, corner),
                             lambda: type(self).forward(self, corner))
    if _state.check.failed:
        return type(self).forward(self, x)
    return fused_forward(self, x)


FORMS = ("exact", "fast", "eager")
"""Attention forms: TransformerLens's arithmetic (blocked), the fused kernel, TransformerLens's own forward."""


def attention_form(model, form: str):
    """:func:`fast_attention` in one of :data:`FORMS` (a context manager yielding whether it is on)."""
    if form not in FORMS:
        raise UserError(f"attention must be one of {', '.join(map(repr, FORMS))}, got {form!r}")
    return fast_attention(model, enabled=form != "eager", fused=form == "fast")


def state_of(model) -> _State:
    """The fast forward's state of ``model`` (inside :func:`fast_attention`), for prefix reuse."""
    active = _ACTIVE.get(model)
    if active is None or active.state is None:
        raise RuntimeError("prefix reuse runs inside fast_attention(model); wrap the calls in it")
    return active.state
