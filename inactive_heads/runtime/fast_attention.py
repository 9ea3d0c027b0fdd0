"""Faster attention for a ``HookedTransformer``, installed per model and only inside a ``with`` block.

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
  ``hook_pattern``/``hook_attn_scores``; where ``hook_pattern`` is hooked by read-only hooks
  (:func:`read_only`: the toolkit's score and ablation hooks are) they get the eager pattern and z
  still comes from the fused kernel, so reading the pattern never changes the numbers;
- with ``fused=False`` (the exact form), computes the pattern with TransformerLens's operations —
  one additive mask per forward instead of ``where`` against a rebuilt one, grouped heads by a
  reshape instead of copies, no NaN pass, and a block of query rows at a time so the scale, mask
  and softmax passes stay in cache (each row's arithmetic is unchanged: logits equal
  TransformerLens's to the bit on SmolLM2) — and z from it;
- hands a hook that may change the pattern (not marked read-only) the whole pattern and takes z
  from what it returns, as TransformerLens does;
- fires ``hook_z`` on ``[batch, pos, head, d_head]`` and applies ``W_O`` as before, so ablation
  at ``hook_z`` is unchanged. With the fused kernel, a gated MLP also uses its weights in place
  (TransformerLens copies each one transposed on every call).

A layer with a hook on ``hook_attn_scores``, a KV cache, or a model feature this forward does not
implement (ALiBi, local windows, attention sinks, score soft-capping, log-n scaling, QKV clipping,
OLMo's full-vector QK norm, 4-bit weights, ``use_attn_result``) runs TransformerLens's own forward.
Results equal the eager path up to float rounding (≤1e-4 on logits in fp32). Leaving the block
restores the modules; other models are never touched.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MethodType

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from ..core.errors import UserError

_MARK = "_inactive_heads_fast_attention"


def supports_fast_attention(model) -> bool:
    """True for a ``HookedTransformer`` whose attention needs nothing this fast path leaves out."""
    from transformer_lens import HookedTransformer

    # isinstance: a subclass (e.g. SAELens' HookedSAETransformer) is a HookedTransformer too.
    if not isinstance(model, HookedTransformer) or not hasattr(model, "blocks"):
        return False
    cfg = model.cfg
    if cfg.positional_embedding_type in ("alibi", "relative_positional_bias"):
        return False
    if getattr(cfg, "attention_dir", "causal") != "causal":
        return False
    unsupported = (
        getattr(cfg, "use_attn_result", False),
        getattr(cfg, "load_in_4bit", False),
        getattr(cfg, "use_attention_sinks", False),
        getattr(cfg, "use_logn_attn", False),
        getattr(cfg, "clip_qkv", None) is not None,
        (getattr(cfg, "attn_scores_soft_cap", None) or -1) > 0,
        cfg.original_architecture in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM"),
    )
    if any(unsupported):
        return False
    return all(getattr(block.attn, "attn_type", "global") == "global" for block in model.blocks)


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

    def __init__(self, layers: dict[int, int]):
        self.layers = layers  # id(attention module) -> layer index
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
            causal = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
            allowed = causal[None, None] & m.to(device)[:, None, None, :]
            if p:
                seen = torch.ones((m.shape[0], 1, q_len, p), dtype=torch.bool, device=device)
                allowed = torch.cat([seen, allowed], dim=-1)
            additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
            additive.masked_fill_(~allowed, float("-inf"))
            value = (allowed, additive, True)
        # A prefix-reusing pass alternates between the prefix's mask and its batch's: keep a few.
        self._masks = [(attention_mask, key, value)] + self._masks[:3]
        return value


READ_ONLY = "_inactive_heads_read_only"


def read_only(hook_fn):
    """Mark a hook function as one that never changes its activation (it returns None, edits nothing)."""
    setattr(hook_fn, READ_ONLY, True)
    return hook_fn


def _read_only(hook_point) -> bool:
    """True when every forward hook on ``hook_point`` wraps a function marked :func:`read_only`."""
    if hook_point._forward_pre_hooks or hook_point._backward_hooks:
        return False
    for wrapper in hook_point._forward_hooks.values():
        cells = getattr(wrapper, "__closure__", None) or ()
        marked = False
        for cell in cells:
            try:
                content = cell.cell_contents
            except ValueError:
                continue
            if callable(content) and getattr(content, READ_ONLY, False):
                marked = True
                break
        if not marked and not getattr(wrapper, READ_ONLY, False):
            return False
    return True


def _hooked(hook_point) -> bool:
    return bool(hook_point._forward_hooks or hook_point._forward_pre_hooks or hook_point._backward_hooks)


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
    b, n, n_heads, d_head = q.shape
    n_keys = k.shape[1]
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
        return _weighted(pattern, vh).transpose(1, 2)
    rows = max(1, _BLOCK_ELEMENTS // max(1, b * n_heads * n_keys))
    pattern = torch.empty((b, n_heads, n, n_keys), dtype=q.dtype, device=q.device) if hooked else None
    z = None if state.fused else torch.empty((b, n_heads, n, d_head), dtype=v.dtype, device=v.device)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        block = _eager_pattern(self, qh, kh, additive, start, stop)
        if pattern is not None:
            pattern[:, :, start:stop] = block
        if z is not None:
            z[:, :, start:stop] = _weighted(block, vh)
    if hooked:
        self.hook_pattern(pattern)  # read-only hooks: they see the whole pattern and change nothing
    if z is None:
        z = _fused(self, qh, kh, vh, allowed, group)
    return z.transpose(1, 2)


def _eager_pattern(self, qh, kh, additive, start: int, stop: int) -> Tensor:
    """Softmax attention weights of query rows ``start:stop``, ``[batch, head, rows, key]``, with
    TransformerLens's operations: grouped product (query heads of one KV head stacked along the
    query axis, no K/V copies), divided by the scale after the product, masked, soft-maxed."""
    b, n_heads, _, d_head = qh.shape
    n_kv, n_keys = kh.shape[1], kh.shape[2]
    m = stop - start
    qg = qh[:, :, start:stop].reshape(b, n_kv, n_heads // n_kv * m, d_head)
    scores = (qg @ kh.transpose(-1, -2).to(qg.dtype)).view(b, n_heads, m, n_keys) / self.attn_scale
    if additive is None:  # plain causal: row i sees keys 0..start+i
        causal = torch.ones(m, n_keys, dtype=torch.bool, device=qh.device).triu(start + 1)
        scores = scores.masked_fill(causal, float("-inf"))
    else:
        scores = scores + additive[:, :, start:stop]
    return torch.softmax(scores, dim=-1)


def _weighted(pattern: Tensor, vh: Tensor) -> Tensor:
    """``pattern @ v`` per head, grouped KV heads without copies: ``[batch, head, rows, d_head]``."""
    b, n_heads, m, n_keys = pattern.shape
    n_kv, d_head = vh.shape[1], vh.shape[3]
    pattern = pattern.to(device=vh.device, dtype=vh.dtype)
    return (pattern.reshape(b, n_kv, n_heads // n_kv * m, n_keys) @ vh).view(b, n_heads, m, d_head)


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
    if (
        past_kv_cache_entry is not None
        or additive_attention_mask is not None
        or position_bias is not None
        or _hooked(self.hook_attn_scores)
        or not usable
    ):
        if prefix is not None or _state.capture is not None:
            raise RuntimeError("prefix reuse needs right-padded batches and no hook on hook_attn_scores")
        return type(self).forward(self, query_input, key_input, value_input, past_kv_cache_entry,
                                  additive_attention_mask, attention_mask, position_bias)
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    offset = prefix.length if prefix is not None else 0
    if self.cfg.positional_embedding_type == "rotary":
        # Right padding: real tokens sit at positions offset, offset + 1, ... (pads never reach them).
        q = self.hook_rot_q(self.apply_rotary(q, offset, None))
        k = self.hook_rot_k(self.apply_rotary(k, offset, None))
    layer = _state.layers[id(self)]
    if _state.capture is not None:
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


@contextmanager
def fast_attention(model, enabled: bool = True, *, fused: bool = True):
    """Use the fast attention forward on ``model`` inside the block; yields whether it is on.

    ``fused=False`` computes every layer's pattern with the grouped eager path instead of the
    fused kernel: a little slower, and the same arithmetic as TransformerLens (bit-identical
    logits on SmolLM2).

    >>> with fast_attention(model):                # doctest: +SKIP
    ...     logits = model(tokens, attention_mask=mask)

    Unsupported models (including ``TransformerBridge``) run unchanged (yields False); a nested
    block keeps the outer one's state.
    """
    if getattr(model, _MARK, None) is not None:
        yield True
        return
    if not enabled or not supports_fast_attention(model):
        yield False
        return
    attns = [block.attn for block in model.blocks]
    state = _State({id(attn): layer for layer, attn in enumerate(attns)})
    state.fused = fused
    patched = {attn: (lambda *a, _f=MethodType(_fast_forward, attn), **kw: _f(*a, _state=state, **kw))
               for attn in attns}
    if fused:
        patched.update({block.mlp: MethodType(_gated_mlp_forward, block.mlp)
                        for block in model.blocks if _plain_gated_mlp(block.mlp)})
    previous = {module: module.__dict__.get("forward") for module in patched}
    setattr(model, _MARK, state)
    try:
        for module, forward in patched.items():
            module.forward = forward
        yield True
    finally:
        for module, prev in previous.items():
            if prev is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = prev
        model.__dict__.pop(_MARK, None)


def _plain_gated_mlp(mlp) -> bool:
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    return type(mlp) is GatedMLP and not (mlp.cfg.is_layer_norm_activation() and mlp.ln is not None)


def _gated_mlp_forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    """TransformerLens's gated MLP (same hooks) with its weights used in place: TransformerLens
    copies each weight transposed on every call (to match Hugging Face's bf16 rounding), which costs
    ~7 % of a forward on CPU. Used only with the fused kernel, whose numbers are within float
    rounding anyway."""
    if self.W_gate.device != x.device:
        x = x.to(self.W_gate.device)
    pre_act = self.hook_pre(x @ self.W_gate)
    pre_linear = self.hook_pre_linear(x @ self.W_in)
    post_act = self.hook_post((self.act_fn(pre_act) * pre_linear) + self.b_in)
    return torch.addmm(self.b_out, post_act.reshape(-1, post_act.shape[-1]), self.W_out).view(
        *post_act.shape[:-1], self.W_out.shape[-1])


FORMS = ("exact", "fast", "eager")
"""Attention forms: TransformerLens's arithmetic (blocked), the fused kernel, TransformerLens's own forward."""


def attention_form(model, form: str):
    """:func:`fast_attention` in one of :data:`FORMS` (a context manager yielding whether it is on)."""
    if form not in FORMS:
        raise UserError(f"attention must be one of {', '.join(map(repr, FORMS))}, got {form!r}")
    return fast_attention(model, enabled=form != "eager", fused=form == "fast")


def state_of(model) -> _State:
    """The fast forward's state of ``model`` (inside :func:`fast_attention`), for prefix reuse."""
    state = getattr(model, _MARK, None)
    if state is None:
        raise RuntimeError("prefix reuse runs inside fast_attention(model); wrap the calls in it")
    return state
