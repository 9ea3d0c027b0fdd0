"""Llama and Qwen2 causal LMs whose attention layers keep only some of their heads.

This file is copied beside the weights of every checkpoint written by ``inactive-heads export
--mode pruned`` and named in its ``config.json`` (``auto_map``), so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` builds the model with
nothing but ``torch`` and ``transformers`` installed. It imports nothing from ``inactive_heads``.

``config.json`` carries, per layer, the original indices of the query heads kept
(``kept_query_heads``) and of the key/value heads kept (``kept_kv_heads``); the counts are in
``num_attention_heads_per_layer`` and ``num_key_value_heads_per_layer``. ``num_attention_heads``
and ``num_key_value_heads`` keep the unpruned model's values (they fix ``head_dim`` and the rotary
embedding). Under grouped-query attention a kept query head reads the key/value head of its
original group, so the groups of a pruned layer may have different sizes: keys and values are
gathered per query head instead of repeated a fixed number of times. A layer with no head left
has no attention projections and no input norm; it adds only the output projection's bias, if the
model has one.
"""

import torch
from torch import nn
from transformers import LlamaForCausalLM, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _projection_biases(config) -> tuple[bool, bool]:
    """(q/k/v bias, o bias) of the family: Qwen2 has q/k/v biases only; Llama follows attention_bias."""
    if config.model_type == "qwen2":
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


class PrunedHeadsAttention(nn.Module):
    """Causal self-attention over the kept query heads; key/value heads gathered per query head."""

    def __init__(self, config, layer_idx: int, kept_query: list[int], kept_kv: list[int]):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = _head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = getattr(config, "attention_dropout", 0.0)
        self.is_causal = True
        self.num_key_value_groups = 1  # keys and values are already one per query head
        group = config.num_attention_heads // config.num_key_value_heads
        self.num_heads, self.num_key_value_heads = len(kept_query), len(kept_kv)
        qkv_bias, o_bias = _projection_biases(config)
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=o_bias)
        kv_of_query = [kept_kv.index(h // group) for h in kept_query]
        # A plain list, made a tensor on first use on each device: a buffer would be left
        # uninitialized by from_pretrained's meta-device construction.
        self.kv_of_query = kv_of_query
        self._kv_index: dict = {}
        n_rep = len(kept_query) // len(kept_kv)
        # Every kept KV head serving as many query heads, in order: a plain repeat, no gather.
        self.uniform = kv_of_query == [i // n_rep for i in range(len(kept_query))]
        layer_types = getattr(config, "layer_types", None)
        self.sliding_window = (
            config.sliding_window if layer_types and layer_types[layer_idx] == "sliding_attention" else None
        )

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        cache = past_key_values
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        if self.uniform:
            n_rep = self.num_heads // self.num_key_value_heads
            key = key.repeat_interleave(n_rep, dim=1) if n_rep > 1 else key
            value = value.repeat_interleave(n_rep, dim=1) if n_rep > 1 else value
        else:
            index = self._kv_index.get(key.device)
            if index is None:
                index = self._kv_index[key.device] = torch.tensor(self.kv_of_query, device=key.device)
            key = key.index_select(1, index)
            value = value.index_select(1, index)
        impl = getattr(self.config, "_attn_implementation", None) or "eager"
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)
        extra = {"sliding_window": self.sliding_window} if self.sliding_window is not None else {}
        out, weights = attention(
            self, query, key, value, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, **extra, **kwargs,
        )
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


class EmptyAttention(nn.Module):
    """A layer whose heads were all removed: it contributes the output projection's bias (or 0)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = _head_dim(config)
        _, o_bias = _projection_biases(config)
        self.o_bias = nn.Parameter(torch.zeros(config.hidden_size)) if o_bias else None

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        cache = past_key_values
        if cache is not None:
            # Zero-head entries keep the cache's length count right (it is read from layer 0).
            b, t = hidden_states.shape[:2]
            empty = hidden_states.new_zeros((b, 0, t, self.head_dim))
            cache.update(empty, empty, self.layer_idx)
        out = hidden_states.new_zeros(hidden_states.shape)
        if self.o_bias is not None:
            out = out + self.o_bias
        return out, None


def prune_attention_layers(model, config) -> None:
    """Replace each decoder layer's attention by the pruned one that ``config`` describes."""
    kept_query, kept_kv = config.kept_query_heads, config.kept_kv_heads
    layers = model.model.layers
    if len(kept_query) != len(layers) or len(kept_kv) != len(layers):
        raise ValueError(f"config lists heads for {len(kept_query)} layers; the model has {len(layers)}")
    for i, layer in enumerate(layers):
        if kept_query[i]:
            layer.self_attn = PrunedHeadsAttention(config, i, list(kept_query[i]), list(kept_kv[i]))
        else:
            layer.self_attn = EmptyAttention(config, i)
            layer.input_layernorm = nn.Identity()


class PrunedLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` with the attention heads listed in ``config.kept_query_heads`` only."""

    def __init__(self, config):
        super().__init__(config)
        prune_attention_layers(self, config)


class PrunedQwen2ForCausalLM(Qwen2ForCausalLM):
    """``Qwen2ForCausalLM`` with the attention heads listed in ``config.kept_query_heads`` only."""

    def __init__(self, config):
        super().__init__(config)
        prune_attention_layers(self, config)
