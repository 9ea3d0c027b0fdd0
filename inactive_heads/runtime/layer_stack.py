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
allow-list (:func:`~inactive_heads.runtime.bridge_attention.unsupported_reason`).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..models.architectures import model_types_with
from ..models.tl_line import is_bridge, is_hooked_transformer
from .fast_attention import allowed_keys

# Hugging Face model types whose base model is embed -> layers (one rotary table) -> norm.
_PLAIN_DECODERS = model_types_with("plain_decoder")


def bridge_unsupported_reason(model) -> str | None:
    """Why :class:`LayerStack` cannot run ``model``'s layers one at a time (None: it can)."""
    if not is_bridge(model):
        return f"{type(model).__name__} is not a TransformerBridge"
    config = getattr(getattr(model, "original_model", None), "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _PLAIN_DECODERS:
        return f"model type {model_type!r} is not one of {sorted(_PLAIN_DECODERS)}"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return "some layers use sliding-window attention"
    if layer_types is None and getattr(config, "sliding_window", None) is not None \
            and getattr(config, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    if any(getattr(model, name, None) is None for name in ("embed", "rotary_emb", "blocks")):
        return "the bridge has no embed, rotary_emb or blocks module"
    return None


class LayerStack:
    """``embed(tokens, mask)`` (the residual stream entering layer 0) and ``layer(resid, l, mask)``
    (the residual stream leaving layer ``l``), for a ``HookedTransformer`` or a supported bridge.

    ``mask`` is the ``[batch, pos]`` 1/0 mask of a right-padded batch; ``prefix`` (the
    fast forward's :class:`~inactive_heads.runtime.fast_attention.PrefixKV`, or None) says how many
    cached positions come before ``resid``'s."""

    def __init__(self, model):
        self.model = model
        self.hooked = is_hooked_transformer(model)
        if not self.hooked:
            reason = bridge_unsupported_reason(model)
            if reason is not None:
                raise RuntimeError(f"LayerStack: {reason}")
        self._masks: list[tuple] = []

    def embed(self, tokens: Int[Tensor, "batch pos"],
              mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        if self.hooked:
            return self.model(tokens, attention_mask=mask, stop_at_layer=0)
        return self.model.embed(tokens)

    def layer(self, resid: Float[Tensor, "batch pos d_model"], layer: int, mask: Int[Tensor, "batch pos"],
              prefix_length: int = 0) -> Float[Tensor, "batch pos d_model"]:
        if self.hooked:
            return self.model(resid, start_at_layer=layer, stop_at_layer=layer + 1, attention_mask=mask)
        positions, additive = self._inputs(resid, mask, prefix_length)
        cos_sin = self.model.rotary_emb(resid, positions)
        out = self.model.blocks[layer](resid, attention_mask=additive, position_ids=positions,
                                       position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

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
