"""The fast and exact attention forms on a TransformerLens 4 ``TransformerBridge``.

A bridge recomputes every layer's attention the observable way: the key and value heads copied
once per query head, the whole ``[batch, head, query, key]`` score tensor scaled, masked and
soft-maxed, then multiplied by the copied values. Inside
:func:`~inactive_heads.runtime.fast_attention.fast_attention` the attention modules of a bridge
this forward supports (:func:`unsupported_reason`) run :func:`bridge_forward` instead, which

- calls the bridge's own projections, so ``hook_in``, ``hook_q``, ``hook_k``, ``hook_v``,
  ``hook_cos``, ``hook_sin``, ``hook_rot_q``, ``hook_rot_k``, ``hook_z`` (the output projection's
  input) and ``hook_out`` fire with the tensors they carry in the bridge's own forward;
- rotates queries and keys with Hugging Face's rotary function, as the bridge does;
- in the fast form, runs PyTorch's fused ``scaled_dot_product_attention`` (Hugging Face's mask,
  grouped KV heads without copies) where nothing hooks the layer's ``hook_pattern``; where only the
  toolkit's read-only hooks read it, they get the pattern and z still comes from the fused kernel;
- in the exact form, computes the pattern with the bridge's operations (the product, then the
  scale, then Hugging Face's additive mask, a float32 softmax), grouped heads by a reshape instead
  of copies and a block of query rows at a time, and z from it;
- hands a hook that may change the pattern the whole pattern and takes z from what it returns.

A KV cache the bridge passes is updated with the layer's keys and values as the bridge does. For
prefix reuse (:mod:`~inactive_heads.runtime.prefix`, run layer by layer by
:mod:`~inactive_heads.runtime.layer_stack`) the forward also keeps a prefix's rotated keys and
values, attends to them before the given tokens, and applies only the output projection to a
prefix's known attention output, as the ``HookedTransformer`` forward does. A
layer with a hook on ``hook_attn_scores``, a mask that is not Hugging Face's 4-D one, or anything
else outside the plain case runs the bridge's own forward. The first time a model runs in a form,
each layer's output is checked against the bridge's own forward (the shared first-use check of
:mod:`~inactive_heads.runtime.fast_attention`); a mismatch beyond float rounding switches the model
back to the bridge's forward, with a warning.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from .grouped import grouped_scores, in_row_blocks, weighted
from .hook_registry import hooked as _hooked
from .hook_registry import only_read_only as _read_only

# Configuration flags under which the bridge computes something this forward does not.
_REFUSED_FLAGS = ("use_split_qkv_input", "use_attn_in", "gated_q_proj", "use_attn_result",
                  "rotary_interleaved_cos_sin", "rotary_adjacent_pairs")
# Attributes of the Hugging Face attention module that change its arithmetic (a key scale, a
# logit soft cap, attention sinks).
_REFUSED_ATTRIBUTES = ("key_multiplier", "attn_logit_softcapping", "sinks")


def unsupported_reason(model) -> str | None:
    """Why :func:`bridge_forward` does not run on ``model`` (None: it does). The allow-list: a
    ``TransformerBridge`` whose every attention module is a ``PositionEmbeddingsAttentionBridge``
    with only ``q``, ``k``, ``v`` and ``o`` (no Q/K norms, no gates), causal, outside compatibility
    mode, with none of the flags and attributes above."""
    if not hasattr(model, "blocks"):
        return f"{type(model).__name__} is not a TransformerBridge"
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
        PositionEmbeddingsAttentionBridge,
    )

    cfg = model.cfg
    for flag in _REFUSED_FLAGS:
        if getattr(cfg, flag, False):
            return f"config {flag}=True is not supported"
    for layer, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if type(attn) is not PositionEmbeddingsAttentionBridge:
            return f"layer {layer}'s attention is a {type(attn).__name__}"
        if getattr(attn, "compatibility_mode", False):
            return "the bridge runs in compatibility mode"
        extra = sorted(set(getattr(attn, "submodules", {})) - {"q", "k", "v", "o"})
        if extra or attn._modules.get("gate") is not None:
            return f"layer {layer}'s attention has {extra or ['gate']} (norms or gates this forward does not compute)"
        if not getattr(attn, "is_causal", True) or getattr(attn, "is_cross_attention", False):
            return f"layer {layer}'s attention is not causal self-attention"
        hf = attn.original_component
        for name in _REFUSED_ATTRIBUTES:
            if getattr(hf, name, None) is not None:
                return f"layer {layer}'s attention has {name}"
        hf_cfg = getattr(hf, "config", None)
        if getattr(hf_cfg, "clip_qkv", None) is not None:
            return "config clip_qkv is not supported"
        rope = getattr(hf_cfg, "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
            return "llama-4 query scaling is not supported"
    return None


def _inputs(args, kwargs):
    """(hidden states, the other keyword arguments) of a call, or None where it is not the plain
    keyword call Hugging Face's decoder layers make."""
    if "hidden_states" in kwargs:
        if args:
            return None
        kwargs = dict(kwargs)
        return kwargs.pop("hidden_states"), kwargs
    if len(args) != 1 or not isinstance(args[0], Tensor):
        return None
    return args[0], dict(kwargs)


def _plain(self, hidden: Tensor, kwargs: dict) -> bool:
    """Whether this call is one :func:`bridge_forward` computes (else the bridge's own forward)."""
    mask = kwargs.get("attention_mask")
    if mask is not None and (mask.ndim != 4 or mask.dtype == torch.bool or mask.shape[-2] != hidden.shape[1]):
        return False
    if kwargs.get("layer_past") is not None or kwargs.get("output_attentions") or kwargs.get("cycle_offset"):
        return False
    if _hooked(self.hook_attn_scores):
        return False
    cache = kwargs.get("past_key_values")
    if cache is not None and (mask is None or getattr(self.original_component, "layer_idx", None) is None):
        return False
    position_embeddings = kwargs.get("position_embeddings")
    rotary = getattr(self.config, "positional_embedding_type", None) == "rotary"
    if position_embeddings is None:
        return not rotary
    if not (isinstance(position_embeddings, tuple) and len(position_embeddings) == 2):
        return False
    return position_embeddings[0].shape[-1] == self.original_component.head_dim


def bridge_forward(self, *args, _state, **kwargs):
    """A supported bridge attention module's forward inside ``fast_attention``: (output, None)."""
    if _state.z_override is not None:
        # The layer's attention output is known (a cached prefix's z, some heads zeroed): only
        # the output projection runs, as the bridge's own forward would apply it to that z.
        z = _state.z_override
        return self.hook_out(self.o.original_component(z.reshape(*z.shape[:2], -1))), None
    parsed = _inputs(args, kwargs)
    if parsed is None or _state.check.failed or not _plain(self, parsed[0], parsed[1]):
        if _state.prefix is not None or _state.capture is not None:
            raise RuntimeError("prefix reuse needs Hugging Face's 4-D mask, no hook on hook_attn_scores and a "
                               "model the fast forward agrees with; run without reuse_prefix")
        return type(self).forward(self, *args, **kwargs)
    hidden, rest = parsed
    layer = _state.layers[id(self)]
    fresh = _state.prefix is None and (
        kwargs.get("attention_mask") is None or kwargs["attention_mask"].shape[-1] == hidden.shape[1])
    if fresh and ("attn", layer) not in _state.check.done:
        # First use of this layer in this form: the batch's first rows and positions (causal: they
        # depend on nothing after them) against the bridge's own forward, without the cache.
        n, m = _state.check.rows, _state.check.positions
        corner = dict(rest, past_key_values=None)
        if corner.get("attention_mask") is not None:
            corner["attention_mask"] = corner["attention_mask"][:n, :, :m, :m]
        if corner.get("position_embeddings") is not None:
            corner["position_embeddings"] = tuple(t[:n, :m] for t in corner["position_embeddings"])
        if torch.is_tensor(corner.get("position_ids")):
            corner["position_ids"] = corner["position_ids"][:n, :m]
        h = hidden[:n, :m]
        _state.check.compare(self, ("attn", layer), lambda: _compute(self, h, corner, _state, capture=False),
                             lambda: type(self).forward(self, h, **corner)[0])
        if _state.check.failed:
            if _state.capture is not None:
                raise RuntimeError("prefix reuse needs a model the fast forward agrees with; run without "
                                   "reuse_prefix")
            return type(self).forward(self, *args, **kwargs)
    return _compute(self, hidden, rest, _state), None


def _compute(self, hidden: Float[Tensor, "batch pos d_model"], kwargs: dict, _state, *,
             capture: bool = True) -> Float[Tensor, "batch pos d_model"]:
    """The attention block's output for one layer, with the bridge's hooks. With a prefix on
    ``_state`` the layer's keys and values follow the prefix's (the mask covers both); with a
    capture (and ``capture``) its rotated keys and values are kept, ``[batch, pos, kv_head, d_head]``
    as on a ``HookedTransformer`` (``capture=False``: the first-use check's corner)."""
    hf = self.original_component
    head_dim = hf.head_dim
    hidden = self.hook_in(hidden)
    b, n = hidden.shape[:2]
    q = self.q(hidden).view(b, n, -1, head_dim).transpose(1, 2)  # [b, head, pos, d]
    k = self.k(hidden).view(b, n, -1, head_dim).transpose(1, 2)  # [b, kv_head, pos, d]
    v = self.v(hidden).view(b, n, -1, head_dim).transpose(1, 2)
    position_embeddings = kwargs.get("position_embeddings")
    if position_embeddings is not None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, self.hook_cos(cos), self.hook_sin(sin))
    q, k = self.hook_rot_q(q), self.hook_rot_k(k)
    if capture and _state.capture is not None:
        _state.capture.keys.append(k.transpose(1, 2))
        _state.capture.values.append(v.transpose(1, 2))
    prefix = _state.prefix
    if prefix is not None:
        layer = _state.layers[id(self)]
        k = torch.cat([prefix.keys[layer].transpose(1, 2).expand(b, -1, -1, -1).to(k.dtype), k], dim=2)
        v = torch.cat([prefix.values[layer].transpose(1, 2).expand(b, -1, -1, -1).to(v.dtype), v], dim=2)
    cache = kwargs.get("past_key_values")
    if cache is not None:
        k, v = cache.update(k, v, hf.layer_idx)
    mask = kwargs.get("attention_mask")
    scaling = getattr(hf, "scaling", head_dim ** -0.5)
    z = _attention(self, q, k, v, mask, scaling, _state.fused)  # [b, head, pos, d]
    o_weight = getattr(getattr(self.o, "original_component", None), "weight", None)
    z = z.transpose(1, 2).reshape(b, n, -1)
    if isinstance(o_weight, Tensor) and o_weight.dtype.is_floating_point and z.dtype != o_weight.dtype:
        z = z.to(o_weight.dtype)
    return self.hook_out(self.o(z))


# The exact form computes attention in blocks of query rows of about this many score elements, so
# the scale, mask and softmax passes stay in cache (each row's numbers are unchanged by blocking).
_BLOCK_ELEMENTS = 1 << 21


def _attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scaling: float,
               fused: bool) -> Float[Tensor, "batch head pos d_head"]:
    n_heads, n, n_keys = q.shape[1], q.shape[2], k.shape[2]
    if mask is None and n_keys != n:
        raise RuntimeError("attention over cached keys needs Hugging Face's attention mask")
    hooked = _hooked(self.hook_pattern)
    if fused and not hooked:
        return _fused(q, k, v, mask, scaling)
    if hooked and not _read_only(self.hook_pattern):
        # A hook may change the pattern: hand it the whole pattern, then use what it returns.
        pattern = self.hook_pattern(_pattern(q, k, mask, scaling, 0, n))
        return weighted(pattern, v)
    pattern, z = in_row_blocks(lambda start, stop: _pattern(q, k, mask, scaling, start, stop), v, n_heads, n,
                               keep_pattern=hooked, keep_z=not fused, block_elements=_BLOCK_ELEMENTS, dtype=q.dtype)
    if hooked:
        self.hook_pattern(pattern)  # read-only hooks: they see the whole pattern and change nothing
    return z if z is not None else _fused(q, k, v, mask, scaling)


def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scaling: float) -> Tensor:
    return F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=None if mask is None else mask.to(q.dtype),
        is_causal=mask is None, scale=scaling, enable_gqa=k.shape[1] != q.shape[1],
    )


def _pattern(q: Tensor, k: Tensor, mask: Tensor | None, scaling: float, start: int, stop: int) -> Tensor:
    """Softmax attention weights of query rows ``start:stop``, ``[batch, head, rows, key]``, with
    the bridge's operations: the product (query heads of one KV head stacked along the query axis,
    no K copies), times the scale, plus Hugging Face's additive mask, a float32 softmax."""
    m, n_keys = stop - start, k.shape[2]
    scores = grouped_scores(q, k, start, stop) * scaling
    if mask is None:  # plain causal: row i sees keys 0..start+i
        causal = torch.ones(m, n_keys, dtype=torch.bool, device=q.device).triu(start + 1)
        scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask[:, :, start:stop].to(scores.dtype)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
