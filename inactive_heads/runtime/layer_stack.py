"""A model's embedding and its layers one at a time, on either TransformerLens line.

Prefix reuse (:mod:`inactive_heads.runtime.prefix`) runs a model layer by layer: the embedding,
then each block on the residual stream it is given. A ``HookedTransformer`` does that itself
(``stop_at_layer=0``, then ``start_at_layer=l, stop_at_layer=l + 1``). A TransformerLens 4
``TransformerBridge`` accepts the same arguments, but its ``start_at_layer`` still runs every
block before ``l`` (and throws their output away), so a layer-by-layer pass would cost a whole
forward per layer. :class:`LayerStack` instead calls the bridge's own modules the way Hugging
Face's decoder does — the embedding bridge, then per layer the block bridge with Hugging Face's
rotary tables (from the bridge's rotary module) and an additive 4-D mask built as Hugging Face's
eager attention builds it (0 where a key is seen, the dtype's lowest value where it is not) — so
every hook the bridge has fires as in its own forward and each layer costs one layer.

Inside :func:`~inactive_heads.runtime.fast_attention.fast_attention`, with a prefix set on its
state, the rest's tokens sit at positions ``prefix.length, prefix.length + 1, ...`` and see every
prefix key (the mask gets those columns; the attention forward joins the prefix's keys and values).

Which bridges: the decoder families whose Hugging Face model is exactly "embed, then the layers
with one rotary table and a causal mask, then the final norm" — Llama, Qwen2 and Mistral — with
every layer full attention (no sliding window), on top of the bridge attention forward's own
allow-list (:func:`~inactive_heads.runtime.bridge_attention.unsupported_reason`). The per-line
calls and checks are the line adapter's (:mod:`inactive_heads.runtime.lines`).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .fast_attention import allowed_keys
from .lines.base import line_of

class LayerStack:
    """``embed(tokens, mask)`` (the residual stream entering layer 0) and ``layer(resid, l, mask)``
    (the residual stream leaving layer ``l``), for a ``HookedTransformer`` or a supported bridge.

    ``mask`` is the ``[batch, pos]`` 1/0 mask of a right-padded batch; ``prefix`` (the
    fast forward's :class:`~inactive_heads.runtime.fast_attention.PrefixKV`, or None) says how many
    cached positions come before ``resid``'s."""

    def __init__(self, model):
        self.model = model
        self.line = line_of(model)
        reason = self.line.layer_stack_unsupported(model)
        if reason is not None:
            raise RuntimeError(f"LayerStack: {reason}")
        self._masks: list[tuple] = []

    def embed(self, tokens: Int[Tensor, "batch pos"],
              mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.line.stack_embed(self.model, tokens, mask)

    def layer(self, resid: Float[Tensor, "batch pos d_model"], layer: int, mask: Int[Tensor, "batch pos"],
              prefix_length: int = 0) -> Float[Tensor, "batch pos d_model"]:
        return self.line.stack_layer(self, resid, layer, mask, prefix_length)

    def _inputs(self, resid: Tensor, mask: Tensor, p: int) -> tuple[Tensor, Tensor]:
        """Positions ``p .. p + pos - 1`` and the additive mask ``[batch, 1, pos, p + pos]``: every
        prefix key, then the causal keys that are not padding (kept for the last few masks: a
        prefix-reusing pass alternates between its prefix's mask and its batch's)."""
        key = (p, resid.dtype, resid.device, resid.shape[1])
        for m, k, value in self._masks:
            if m is mask and k == key:
                return value
        n = resid.shape[1]
        positions = torch.arange(p, p + n, device=resid.device)[None]
        allowed = allowed_keys(mask.to(resid.device).bool(), n, p)
        additive = torch.zeros(allowed.shape, dtype=resid.dtype, device=resid.device)
        additive.masked_fill_(~allowed, torch.finfo(resid.dtype).min)
        value = (positions, additive)
        self._masks = [(mask, key, value)] + self._masks[:3]
        return value
