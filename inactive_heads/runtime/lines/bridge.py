"""The ``TransformerBridge`` line (TransformerLens 4, and 3.9's bridge): every line-specific piece
of the toolkit for that class, behind :class:`~inactive_heads.runtime.lines.base.ModelLine`.

A bridge wraps the Hugging Face modules themselves: its fast and exact attention forms are
:mod:`~inactive_heads.runtime.bridge_attention`'s, its logits at chosen positions and its KV cache
come from the Hugging Face base model, and its layers run one at a time through its own modules.
"""

from __future__ import annotations

from contextlib import nullcontext


import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ...models.architectures import by_class, model_types_with
from ...models.loading import architecture_of
from ...models.tl_line import is_bridge
from ..bridge_attention import _inputs, bridge_forward
from ..bridge_attention import unsupported_reason as _attention_unsupported
from ..fast_attention import attention_form
from ..hooks import run_forward
from ..skip_kernels import Packed, attend, output, project, seen_keys_from_4d
from .base import register

# Hugging Face model types whose base model is embed -> layers (one rotary table) -> norm.
_PLAIN_DECODERS = model_types_with("plain_decoder")


def hf_head_logits_supported(model) -> bool:
    """True for a ``TransformerBridge`` whose Hugging Face causal-LM head is one linear map of the
    base model's last hidden state (:func:`hf_head_logits` then gives its logits)."""
    hf = getattr(model, "original_model", None)
    return hf is not None and by_class(architecture_of(hf.config)).head_is_one_linear


def _base_model_takes_masks(model) -> bool:
    """Whether the Hugging Face base model may be called with an attention mask: not where
    TransformerLens's own attention runs (a family the toolkit's forms do not cover, e.g. OLMo-2's
    Q/K norms) in a dtype other than float32, which fails there (its rotary embedding leaves the
    queries in float32 beside lower-precision values); the bridge's own forward is run instead."""
    return next(model.parameters()).dtype == torch.float32 or _attention_unsupported(model) is None


def hf_head_logits(model, hidden: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows vocab"]:
    """A bridge's logits from its Hugging Face base model's last hidden state at chosen rows: the
    output embedding, then the logit soft cap of the models that have one (Gemma-2/3, as their
    causal-LM head does)."""
    hf = model.original_model
    logits = hf.get_output_embeddings()(hidden)
    cap = getattr(hf.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _layer_stack_unsupported(model) -> str | None:
    """Why :class:`~inactive_heads.runtime.layer_stack.LayerStack` cannot run a bridge's layers
    one at a time (None: it can)."""
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


class CachedDecoder:
    """A batch of left-padded prompts decoded with Hugging Face's KV cache on a ``TransformerBridge``:
    prefilled once through the bridge's Hugging Face base model (the bridge's modules and hooks run
    inside it; positions from the mask, as Hugging Face's ``generate`` gives them), then one token
    per row per :meth:`step`; only the last position is projected to the vocabulary. Use inside
    :meth:`forms` and ``torch.inference_mode()``."""

    def __init__(self, model, tokens: Int[Tensor, "batch pos"], mask: Int[Tensor, "batch pos"]):
        from transformers import DynamicCache

        self.model, self.base = model, model.original_model.base_model
        self.cache = DynamicCache(config=model.original_model.config)
        self.mask = mask
        self.logits = self._run(tokens, (mask.cumsum(dim=-1) - 1).masked_fill(mask == 0, 1))

    @staticmethod
    def forms(model):
        """The exact form: the bridge's arithmetic, as the uncached path runs it."""
        return attention_form(model, "exact")

    def _run(self, tokens: Tensor, positions: Tensor) -> Float[Tensor, "batch vocab"]:
        hidden = self.base(input_ids=tokens, attention_mask=self.mask, position_ids=positions,
                           past_key_values=self.cache, use_cache=True).last_hidden_state
        return hf_head_logits(self.model, hidden[:, -1])

    def keep(self, index: Int[Tensor, " kept"]) -> None:
        """Only these rows go on (their cache rows kept, the others dropped)."""
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def step(self, tokens: Int[Tensor, " batch"]) -> Float[Tensor, "batch vocab"]:
        """Each row's next-token logits after appending its token."""
        positions = self.mask.sum(dim=1, keepdim=True)  # the next real position of each row
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.logits = self._run(tokens[:, None], positions)
        return self.logits


def _skip_attention(self, state, layer: int, *args, **kwargs):
    """A ``TransformerBridge`` attention module's forward inside
    :func:`~inactive_heads.pruning.skipping.skipping`: (output, None)."""
    parsed = _inputs(args, kwargs)
    if parsed is None:
        raise RuntimeError("head skipping: this attention call is not Hugging Face's keyword call")
    x, rest = parsed
    b, n = x.shape[:2]
    hf = self.original_component
    cache = rest.get("past_key_values")
    offset = cache.get_seq_length(hf.layer_idx) if cache is not None else 0
    n_keys = offset + n
    mask = rest.get("attention_mask")
    cos_sin = rest.get("position_embeddings")
    held = state.held_at(layer, b, x.device)

    def run(rows, packed: Packed, zero: Tensor | None):
        xs = x if rows is None else x[rows]
        q, k, v = (t.transpose(1, 2) for t in project(xs, packed))  # [b, head, pos, d]
        if cos_sin is not None:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            cos, sin = cos_sin
            if rows is not None:
                cos, sin = (t[rows] if t.shape[0] == b and b > 1 else t for t in (cos, sin))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, hf.layer_idx)
        allowed = state.allowed(mask, rows, n, n_keys, lambda: seen_keys_from_4d(
            mask if rows is None or mask is None or mask.shape[0] != b else mask[rows], n, n_keys, x.device))
        z = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), packed, allowed,
                   getattr(hf, "scaling", hf.head_dim ** -0.5))
        return output(z, packed, zero)

    return state.by_groups(layer, held, n, n_keys, cache is not None, run, x), None


class BridgeLine:
    """A ``TransformerBridge``: :mod:`~inactive_heads.runtime.bridge_attention`'s forward, the Hugging
    Face head and KV cache, and the bridge's own modules for one layer at a time."""

    name = "bridge"
    attention_forward = staticmethod(bridge_forward)
    skip_attention = staticmethod(_skip_attention)
    # A bridge outside its allow-list (Q/K norms, soft caps, joint QKV: Gemma, Phi-3, ...) runs
    # its own forward as it always did; nothing to warn about.
    warns_when_unsupported = False

    def owns(self, model) -> bool:
        return is_bridge(model)

    def attention_unsupported(self, model) -> str | None:
        return _attention_unsupported(model)

    def plain_gated_mlp(self, mlp) -> bool:
        return False  # the bridge runs Hugging Face's MLP modules

    def unembed(self, unembed, x: Float[Tensor, "n 1 d_model"]) -> Float[Tensor, "n 1 vocab"]:
        return unembed(x)

    def logits_at(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                  rows: Int[Tensor, " n"], positions: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """Through the Hugging Face base model (the bridge's modules and hooks run inside it), the
        vocabulary projection on the chosen rows only, where the head is one linear map; else the
        whole forward, sliced."""
        mask = valid.long()
        if hf_head_logits_supported(model) and _base_model_takes_masks(model):
            hf = model.original_model
            hidden = hf.base_model(input_ids=tokens, attention_mask=mask, use_cache=False).last_hidden_state
            return hf_head_logits(model, hidden[rows, positions])
        return model(tokens, attention_mask=mask)[rows, positions]

    def last_logits(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                    rows: Int[Tensor, " n"], last: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """The bridge's whole forward in the exact form, sliced."""
        return run_forward(model, tokens, valid)[rows, last]

    def cached_decoder(self, model):
        return CachedDecoder if hf_head_logits_supported(model) else None

    def prefix_reuse_supported(self, model) -> bool:
        return _layer_stack_unsupported(model) is None

    def layer_stack_unsupported(self, model) -> str | None:
        return _layer_stack_unsupported(model)

    def stack_embed(self, model, tokens: Int[Tensor, "batch pos"],
                    mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return model.embed(tokens)

    def stack_layer(self, stack, resid: Float[Tensor, "batch pos d_model"], layer: int,
                    mask: Int[Tensor, "batch pos"], prefix_length: int) -> Float[Tensor, "batch pos d_model"]:
        positions, additive = stack._inputs(resid, mask, prefix_length)
        cos_sin = stack.model.rotary_emb(resid, positions)
        out = stack.model.blocks[layer](resid, attention_mask=additive, position_ids=positions,
                                        position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    def skip_unsupported(self, model) -> str | None:
        return _layer_stack_unsupported(model) or _attention_unsupported(model)

    def skip_weights(self, model, layer: int) -> dict[str, Tensor | None]:
        hf = model.blocks[layer].attn.original_component
        d = hf.head_dim

        def per_head(linear):
            w = linear.weight
            b = linear.bias
            return w.view(-1, d, w.shape[-1]), None if b is None else b.view(-1, d)

        q, b_q = per_head(hf.q_proj)
        k, b_k = per_head(hf.k_proj)
        v, b_v = per_head(hf.v_proj)
        o = hf.o_proj.weight
        return {"q": q, "b_q": b_q, "k": k, "b_k": b_k, "v": v, "b_v": b_v, "o": o.view(o.shape[0], -1, d),
                "b_o": hf.o_proj.bias}

    def skip_cache_offset(self, model):
        return nullcontext()

    def skip_forward_kwargs(self) -> dict:
        # A bridge's forward would fill a Hugging Face cache it then throws away (one per batch,
        # so rows holding different heads could not share it): none is made.
        return {"use_cache": False}


BRIDGE = register(BridgeLine())
