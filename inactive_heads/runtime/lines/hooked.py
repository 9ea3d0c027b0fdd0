"""The ``HookedTransformer`` line (TransformerLens 3.9): every line-specific piece of the toolkit
for that class, behind :class:`~inactive_heads.runtime.lines.base.ModelLine`.

Retiring TransformerLens 3.9 means deleting this module (and its import in
``inactive_heads/runtime/__init__.py``).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ...models.architectures import by_class
from ...models.tl_line import has_hooked_transformer, is_hooked_transformer
from ..activations import keeps_transposes, transposed_weight
from ..fast_attention import _fast_forward, attention_form
from ..gated_mlp import gated_mlps_without_copies
from ..hooks import unembed_at
from ..skip_kernels import Packed, attend, output, project, seen_keys
from .base import register

# ----------------------------------------------------------------------------------------------
# What the attention forms support: an allow-list of TransformerLens configurations

# Config fields the fast forward handles, each with the values it supports. Everything it computes
# itself (the mask, the softmax, z, W_O) is only right for these; q/k/v, QK norm and rotary
# (including partial rotary and the NTK/YaRN tables) come from TransformerLens's own methods.
_ALLOWED = {
    "positional_embedding_type": lambda v: v in ("standard", "rotary"),
    "attention_dir": lambda v: v == "causal",
    "use_attn_result": lambda v: v is False,
    "load_in_4bit": lambda v: v is False,
    "quantization_method": lambda v: v is None,
    "use_attention_sinks": lambda v: v is False,
    "use_logn_attn": lambda v: v is False,
    "use_dynamic_ntk_rope": lambda v: v is False,
    "use_local_attn": lambda v: v is False,
    "attn_types": lambda v: v is None or all(t == "global" for t in v),
    "clip_qkv": lambda v: v is None,
    "attn_scores_soft_cap": lambda v: v is None or v <= 0,
    # OLMo's QK norm acts on the whole projected vector, outside calculate_qkv_matrices.
    "original_architecture": lambda v: not by_class(v).qk_norm,
}

# Config fields that do not change what an attention module (or a plain gated MLP) computes from
# its inputs, or that change it only through TransformerLens's own methods the fast forward calls.
_NEUTRAL = frozenset({
    "d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_mlp", "d_vocab", "device", "use_split_qkv_input",
    "default_prepend_bos", "n_key_value_heads", "attn_only", "gated_mlp", "uses_rms_norm", "eps",
    "layer_norm_folding", "act_fn", "normalization_type", "num_experts", "experts_per_token", "final_rms",
    "dtype", "model_name", "use_attn_scale", "attn_scale", "use_hook_mlp_in", "use_attn_in", "use_qk_norm",
    "train_seq_length", "ungroup_grouped_query_attention", "from_checkpoint", "checkpoint_index",
    "checkpoint_label_type", "checkpoint_value", "tokenizer_name", "window_size", "init_mode", "n_devices",
    "seed", "initializer_range", "init_weights", "scale_attn_by_inverse_layer_idx", "d_vocab_out",
    "parallel_attn_mlp", "rotary_dim", "n_params", "use_hook_tokens", "tokenizer_prepends_bos",
    "post_embedding_ln", "rotary_base", "rotary_base_local", "rotary_scaling_factor", "trust_remote_code",
    "rotary_adjacent_pairs", "relative_attention_max_distance", "relative_attention_num_buckets",
    "decoder_start_token_id", "tie_word_embeddings", "use_normalization_before_and_after",
    "output_logits_soft_cap", "use_NTK_by_parts_rope", "NTK_by_parts_low_freq_factor",
    "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "NTK_original_ctx_len", "use_yarn_rope",
    "yarn_factor", "yarn_attention_factor", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_original_max_position_embeddings", "yarn_truncate", "yarn_global_attn_only", "norm_topk_prob",
})


def _attention_unsupported(model) -> str | None:
    """Why the fast forward does not run on ``model`` (None: it does). The allow-list: a
    ``HookedTransformer`` whose attention modules are TransformerLens's ``Attention`` or
    ``GroupedQueryAttention`` (global, causal) and whose every config field is one this forward
    knows, at a value it supports; a field it does not know (a newer TransformerLens) is refused."""
    if not hasattr(model, "blocks"):
        return f"{type(model).__name__} is not a HookedTransformer"
    from transformer_lens.components import Attention, GroupedQueryAttention

    cfg = model.cfg
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name, None)
        check = _ALLOWED.get(f.name)
        if check is not None:
            if not check(value):
                return f"config {f.name}={value!r} is not supported"
        elif f.name not in _NEUTRAL:
            return f"config field {f.name!r} is unknown to this toolkit (a newer TransformerLens?)"
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        if type(attn) not in (Attention, GroupedQueryAttention):
            return f"layer {layer}'s attention is a {type(attn).__name__}"
        if getattr(attn, "attn_type", "global") != "global" or getattr(attn, "_attention_dir_override", None):
            return f"layer {layer}'s attention is local or not causal"
    return None


class CachedDecoder:
    """A batch of left-padded prompts decoded with TransformerLens's KV cache on a
    ``HookedTransformer``: prefilled once, then one token per row per :meth:`step`; the
    unembedding runs on the last position only. Use inside :meth:`forms` and
    ``torch.inference_mode()``."""

    def __init__(self, model, tokens: Int[Tensor, "batch pos"], mask: Int[Tensor, "batch pos"]):
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

        self.model = model
        self.cache = TransformerLensKeyValueCache.init_cache(model.cfg, tokens.device, tokens.shape[0])
        self.logits = self._run(tokens, mask)

    @staticmethod
    @contextmanager
    def forms(model):
        """TransformerLens's own attention runs with a cache (the fast forward steps aside); its
        gated MLPs keep their arithmetic without copying their weights at every step."""
        with attention_form(model, "eager"), gated_mlps_without_copies(model):
            yield

    def _run(self, tokens: Tensor, mask: Tensor) -> Float[Tensor, "batch vocab"]:
        resid = self.model(tokens, attention_mask=mask, past_kv_cache=self.cache,
                           stop_at_layer=self.model.cfg.n_layers)
        rows = torch.arange(tokens.shape[0], device=resid.device)
        return unembed_at(self.model, resid, rows, torch.full_like(rows, resid.shape[1] - 1))

    def keep(self, index: Int[Tensor, " kept"]) -> None:
        """Only these rows go on (their cache rows kept, the others dropped)."""
        index = index.to(self.cache.previous_attention_mask.device)
        for entry in self.cache.entries:
            entry.past_keys = entry.past_keys[index]
            entry.past_values = entry.past_values[index]
        self.cache.previous_attention_mask = self.cache.previous_attention_mask[index]

    def step(self, tokens: Int[Tensor, " batch"]) -> Float[Tensor, "batch vocab"]:
        """Each row's next-token logits after appending its token."""
        self.logits = self._run(tokens[:, None], torch.ones_like(tokens)[:, None])
        return self.logits


def _skip_attention(self, state, layer: int, query_input, key_input=None, value_input=None,
                    past_kv_cache_entry=None, additive_attention_mask=None, attention_mask=None,
                    position_bias=None):
    """A ``HookedTransformer`` attention module's forward inside
    :func:`~inactive_heads.pruning.skipping.skipping`: the kept heads only (or every head, the held
    ones zeroed, where the cost rule says dense)."""
    if additive_attention_mask is not None or position_bias is not None or query_input.ndim != 3:
        raise RuntimeError("head skipping: this attention call is not a plain causal one")
    x = query_input
    b, n = x.shape[:2]
    offset = 0 if past_kv_cache_entry is None else past_kv_cache_entry.past_keys.shape[1]
    n_keys = offset + n

    def rotate(t, at):  # [b, pos, head, d]; TransformerLens caches keys unrotated
        return self.apply_rotary(t, at, rows_mask)

    def allowed_for(rows):
        return seen_keys(None if attention_mask is None else attention_mask[rows].to(x.device), n, n_keys, x.device)

    def cache(k, v):
        if past_kv_cache_entry is None:
            return k, v
        entry = past_kv_cache_entry
        if entry.past_keys.shape[1] == 0 and entry.past_keys.shape[2] != k.shape[2]:
            entry.past_keys = entry.past_keys.new_empty((b, 0, k.shape[2], k.shape[3]))
            entry.past_values = entry.past_values.new_empty((b, 0, v.shape[2], v.shape[3]))
        return entry.append(k, v)

    rows_mask = attention_mask
    held = state.held_at(layer, b, x.device)

    def run(rows, packed: Packed, zero: Tensor | None):
        nonlocal rows_mask
        xs = x if rows is None else x[rows]
        rows_mask = attention_mask if rows is None or attention_mask is None else attention_mask[rows]
        q, k, v = project(xs, packed)
        k, v = cache(k, v)
        q, k = rotate(q, offset), rotate(k, 0)
        z = attend(q, k, v, packed, allowed_for(slice(None) if rows is None else rows), 1.0 / self.attn_scale)
        return output(z, packed, zero)

    return state.by_groups(layer, held, n, n_keys, past_kv_cache_entry is not None, run, x)


class HookedLine:
    """TransformerLens 3.9's ``HookedTransformer`` (or a subclass, e.g. SAELens'
    ``HookedSAETransformer``): the toolkit's fast forward, TransformerLens's own unembedding and KV
    cache, ``start_at_layer``/``stop_at_layer`` for one layer at a time."""

    name = "hooked"
    attention_forward = staticmethod(_fast_forward)
    skip_attention = staticmethod(_skip_attention)
    warns_when_unsupported = True

    def owns(self, model) -> bool:
        return is_hooked_transformer(model)

    def attention_unsupported(self, model) -> str | None:
        return _attention_unsupported(model)

    def plain_gated_mlp(self, mlp) -> bool:
        """Whether ``mlp`` is TransformerLens's own ``GatedMLP`` (no layer-norm activation)."""
        if not has_hooked_transformer():  # TransformerLens 4: no GatedMLP component to stand in for
            return False
        from transformer_lens.components.mlps.gated_mlp import GatedMLP

        return type(mlp) is GatedMLP and not (mlp.cfg.is_layer_norm_activation() and mlp.ln is not None)

    def unembed(self, unembed, x: Float[Tensor, "n 1 d_model"]) -> Float[Tensor, "n 1 vocab"]:
        """TransformerLens's ``Unembed`` (its hooks, its arithmetic) without the per-call copy.

        Its forward computes ``F.linear(x, W_U.T.contiguous(), b_U)``: a transposed copy of the whole
        unembedding on every call (160 ms per call for SmolLM2's 49 k × 576 on 2 CPU cores, more than
        the product itself). Where :func:`~inactive_heads.runtime.activations.keeps_transposes` (CPU,
        gradients off), the copy is made once per weight
        (:func:`~inactive_heads.runtime.activations.transposed_weight`), and the same ``F.linear``
        call gives the same bits. Elsewhere (GPU, gradients, a subclass) TransformerLens's forward runs."""
        if not has_hooked_transformer():  # TransformerLens 4 has no Unembed component
            return unembed(x)
        from transformer_lens.components import Unembed

        W = unembed.W_U
        if type(unembed) is not Unembed or not keeps_transposes(W) or x.device != W.device:
            return unembed(x)
        return unembed.hook_out(F.linear(unembed.hook_in(x), transposed_weight(W), unembed.b_U))

    def logits_at(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                  rows: Int[Tensor, " n"], positions: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """The blocks and final residual stream in the caller's form, then the unembedding on the
        chosen rows only."""
        mask = valid.long()
        if hasattr(model, "unembed"):
            resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layers)
            return unembed_at(model, resid, rows, positions)
        return model(tokens, attention_mask=mask)[rows, positions]

    def last_logits(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                    rows: Int[Tensor, " n"], last: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """The exact form forced, then the unembedding on each row's last position only."""
        mask = valid.to(dtype=torch.long, device=tokens.device)
        with attention_form(model, "exact"):
            resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layers)
        return unembed_at(model, resid, rows, last)

    def cached_decoder(self, model):
        return CachedDecoder

    def prefix_reuse_supported(self, model) -> bool:
        return model.cfg.positional_embedding_type == "rotary"

    def layer_stack_unsupported(self, model) -> str | None:
        return None

    def stack_embed(self, model, tokens: Int[Tensor, "batch pos"],
                    mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return model(tokens, attention_mask=mask, stop_at_layer=0)

    def stack_layer(self, stack, resid: Float[Tensor, "batch pos d_model"], layer: int,
                    mask: Int[Tensor, "batch pos"], prefix_length: int) -> Float[Tensor, "batch pos d_model"]:
        return stack.model(resid, start_at_layer=layer, stop_at_layer=layer + 1, attention_mask=mask)

    def skip_unsupported(self, model) -> str | None:
        reason = _attention_unsupported(model)
        if reason is not None:
            return reason
        cfg = model.cfg
        arch = getattr(cfg, "original_architecture", None)
        if cfg.positional_embedding_type != "rotary":
            return "its positions are not rotary"
        if arch is not None and arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"):
            return f"it is a {arch}"
        if getattr(cfg, "window_size", None):
            return "it uses sliding-window attention"
        return None

    def skip_weights(self, model, layer: int) -> dict[str, Tensor | None]:
        attn = model.blocks[layer].attn
        w_k = getattr(attn, "_W_K", None)
        grouped = w_k is not None
        w_k, b_k = (attn._W_K, attn._b_K) if grouped else (attn.W_K, attn.b_K)
        w_v, b_v = (attn._W_V, attn._b_V) if grouped else (attn.W_V, attn.b_V)
        return {"q": attn.W_Q.transpose(1, 2), "b_q": attn.b_Q, "k": w_k.transpose(1, 2), "b_k": b_k,
                "v": w_v.transpose(1, 2), "b_v": b_v, "o": attn.W_O.permute(2, 0, 1), "b_o": attn.b_O}

    @contextmanager
    def skip_cache_offset(self, model):
        """The cache's position offset read without its check that the cache holds every KV head
        (a skipping cache holds only the kept ones)."""

        def get_pos_offset(past_kv_cache, batch_size):
            if past_kv_cache is None:
                return 0
            keys = past_kv_cache[0].past_keys
            if keys.shape[0] != batch_size:
                raise RuntimeError(f"the KV cache has {keys.shape[0]} rows, the batch {batch_size}")
            return keys.shape[1]

        object.__setattr__(model, "get_pos_offset", get_pos_offset)
        try:
            yield
        finally:
            model.__dict__.pop("get_pos_offset", None)

    def skip_forward_kwargs(self) -> dict:
        return {}


HOOKED = register(HookedLine())
