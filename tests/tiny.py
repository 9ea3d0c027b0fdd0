"""A tiny synthetic GQA HookedTransformer for unit tests (no weights to load)."""

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig


def tiny_gqa_model(seed: int = 0, n_layers: int = 3) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=32,
        n_heads=6,
        n_key_value_heads=2,
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


def random_sequences(n: int, *, seed: int = 0, min_len: int = 3, max_len: int = 20, vocab: int = 97):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (k,), generator=gen).tolist() for k in lengths]
