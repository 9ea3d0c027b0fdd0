"""Tiny random-weight models for tests: a synthetic GQA HookedTransformer (TransformerLens 3.9
only; tests using it carry the ``hooked`` marker) and Hugging Face models of every family."""

from typing import Any

import torch


def tiny_gqa_model(seed: int = 0, n_layers: int = 3, n_kv_heads: int = 2):
    """A tiny GQA model (6 query heads, 2 KV heads of 8 dims, rotary, gated MLP, RMS norm, a random
    ``b_O``): a ``HookedTransformer`` on TransformerLens 3.9, a ``TransformerBridge`` over the same
    shapes of Hugging Face Llama on 4 (d_model 48 there: Llama needs heads × d_head = d_model).
    ``n_kv_heads=6``: one KV head per query head (TransformerLens's plain ``Attention``)."""
    from inactive_heads.models.tl_line import has_hooked_transformer

    if not has_hooked_transformer():
        return tiny_gqa_bridge(seed, n_layers, n_kv_heads)
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=32,
        n_heads=6,
        n_key_value_heads=None if n_kv_heads == 6 else n_kv_heads,
        d_head=8,
        d_mlp=64,
        n_ctx=64,
        d_vocab=97,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=8,
        gated_mlp=True,
        seed=seed,
        dtype=torch.float32,
    )
    model = HookedTransformer(cfg)
    with torch.no_grad():  # non-zero biases so "zeroing every head leaves b_O" is a real check
        for block in model.blocks:
            block.attn.b_O.normal_(0, 0.5)
    model.eval()
    return model


TINY_GQA_VOCAB = 97


def _word_tokenizer(directory, vocab_size: int):
    """A word-level tokenizer over ``t0 … t{vocab_size-1}`` (pad t0, BOS t1, EOS t2), saved to
    ``directory`` and read back (no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def tiny_gqa_bridge(seed: int = 0, n_layers: int = 3, n_kv_heads: int = 2):
    """The tiny GQA model as a ``TransformerBridge`` over a saved Hugging Face Llama (both lines)."""
    import tempfile

    from transformers import AutoModelForCausalLM, LlamaConfig

    from inactive_heads.models.loading import load_model

    directory = tempfile.mkdtemp(prefix="ih-tiny-gqa-")
    _word_tokenizer(directory, TINY_GQA_VOCAB)
    config = LlamaConfig(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=n_kv_heads, head_dim=8, intermediate_size=64,
        num_hidden_layers=n_layers, vocab_size=TINY_GQA_VOCAB, max_position_embeddings=64,
        attention_bias=True, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():  # as the HookedTransformer above: zero q/k/v biases, a random b_O
        for layer in hf.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.bias.zero_()
            attn.o_proj.bias.normal_(0, 0.5)
    hf.save_pretrained(directory)
    return load_model(directory, backend="bridge", progress=False)


def value_weights(model, layer: int):
    """The value projection ``model``'s forward reads at ``layer``, KV head first, as tensors that
    edit the model in place: ``(W [kv_head, ...], b [kv_head, d_head])``. A ``HookedTransformer``'s
    ``_W_V``/``_b_V``; a bridge's Hugging Face ``v_proj`` viewed per KV head."""
    from inactive_heads.models.tl_line import is_hooked_transformer

    if is_hooked_transformer(model):
        return model.blocks[layer].attn._W_V, model.blocks[layer].attn._b_V
    v_proj = model.original_model.model.layers[layer].self_attn.v_proj
    kv, d_head = model.cfg.n_key_value_heads, model.cfg.d_head
    return v_proj.weight.view(kv, d_head, -1), v_proj.bias.view(kv, d_head)


def random_sequences(n: int, *, seed: int = 0, min_len: int = 3, max_len: int = 20, vocab: int = 97):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (k,), generator=gen).tolist() for k in lengths]


# ----------------------------------------------------------------------------------------------
# Tiny random-weight Hugging Face models of every supported family, saved as local directories

# Features are made small enough to matter on inputs of ~20 tokens: llama3/longrope rope scaling
# with original_max_position_embeddings=8, sliding windows of 4, Gemma's query_pre_attn_scalar
# different from head_dim, partial rotary embeddings.
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}


def _family_configs(vocab_size: int) -> dict[str, Any]:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        Olmo2Config,
        Phi3Config,
        Qwen2Config,
    )

    gqa = dict(_COMMON, num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=128)
    rope_half = 16 // 2  # head_dim 16: rotary frequencies per head
    longrope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(rope_half)],
        "long_factor": [1.0 + 0.5 * i for i in range(rope_half)],
        "original_max_position_embeddings": 8,
    }
    return {
        "llama-3.2": LlamaConfig(**gqa, tie_word_embeddings=True, rope_parameters=dict(_LLAMA3_ROPE, factor=32.0)),
        "llama-3.1": LlamaConfig(**gqa, tie_word_embeddings=False, rope_parameters=dict(_LLAMA3_ROPE)),
        "olmo-2": Olmo2Config(**gqa, tie_word_embeddings=False),
        "qwen2.5-tied": Qwen2Config(**gqa, tie_word_embeddings=True),
        "qwen2.5-untied": Qwen2Config(**gqa, tie_word_embeddings=False),
        "gemma-2": Gemma2Config(
            **gqa, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        ),
        "gemma-3": Gemma3TextConfig(
            **gqa, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
        "mistral": MistralConfig(**gqa, sliding_window=4),
        "phi-3-window": Phi3Config(**gqa, sliding_window=4),
        "phi-3-longrope": Phi3Config(**gqa, original_max_position_embeddings=8, rope_parameters=longrope),
        "phi-3-partial-rotary": Phi3Config(
            **gqa, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        ),
        "gpt2": GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=128, vocab_size=vocab_size),
        "gpt-neox": GPTNeoXConfig(
            **{k: v for k, v in gqa.items() if k != "num_key_value_heads"},
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
    }


FAMILIES = (
    "llama-3.2", "llama-3.1", "olmo-2", "qwen2.5-tied", "qwen2.5-untied", "gemma-2", "gemma-3",
    "mistral", "phi-3-window", "phi-3-longrope", "phi-3-partial-rotary", "gpt2", "gpt-neox",
)


TINY_VOCAB = 512  # the tiny models' vocabulary: the first ids of the tokenizer they are saved with


def save_tiny_family(family: str, directory, tokenizer, *, seed: int = 0, vocab_size: int = TINY_VOCAB):
    """Build a tiny random-weight model of ``family``, perturb its biases and norm weights (so a
    dropped one shows in the logits), and save it with ``tokenizer`` to ``directory``.

    The model's vocabulary is the tokenizer's first ``vocab_size`` ids (small embeddings keep
    saving and loading fast); inputs must use ids below it."""
    from transformers import AutoModelForCausalLM

    special = [i for i in (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None]
    assert max(special, default=0) < vocab_size, "the tokenizer's special ids must fit the vocabulary"
    config = _family_configs(vocab_size)[family]
    # The tokenizer's special ids, not the family's defaults (Phi-3's pad id 32000 is past the vocabulary).
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                param.add_(0.2 * torch.randn(param.shape, generator=gen))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_tiny_llama_with_smollm2_tokenizer(directory) -> str:
    """A tiny random-weight Llama saved with the SmolLM2 tokenizer: real task prompts (its whole
    vocabulary, 49,152 ids) and fast passes; loadable by path, also by Ray workers and subprocesses."""
    from transformers import AutoTokenizer

    from inactive_heads.models.loading import resolve_model_dir

    local_dir, _ = resolve_model_dir("smollm2-135m", progress=False)
    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    return str(save_tiny_family("llama-3.2", directory, tokenizer, vocab_size=len(tokenizer)))
