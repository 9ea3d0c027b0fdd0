"""Random's draws depend on the seed, the (prompt, step) and the model's shape only: not on
max_new_tokens, the batch size or the decision mode; and no two seeds share a draw."""

import hashlib

import pytest
import torch

from inactive_heads.ablation.head_ablation import RandomAblation
from inactive_heads.evaluation.generation import generate
from inactive_heads.scoring.scores import random_key
from tests.tiny import random_sequences, tiny_gqa_model

PROMPTS = random_sequences(3, seed=4, min_len=3, max_len=9)
P = 0.4


@pytest.fixture(scope="module")
def model():
    return tiny_gqa_model(seed=3)


def by_hand(seed: int, prompt: int, step: int, n_layers: int, n_heads: int) -> torch.Tensor:
    """The documented rule, written out: id = prompt + step * 2**32; an id below 1_000_003 seeds the
    generator with ((seed * 1_000_003 + id) << 12) + layer, a larger one with the little-endian
    8-byte blake2b of "random:{seed}:{id}:{layer}"; a head is zeroed where u < p."""
    seq = prompt + step * 2**32
    rows = []
    for layer in range(n_layers):
        if seq < 1_000_003:
            key = ((seed * 1_000_003 + seq) << 12) + layer
        else:
            key = int.from_bytes(hashlib.blake2b(f"random:{seed}:{seq}:{layer}".encode(), digest_size=8).digest(),
                                 "little")
        rows.append(torch.rand(n_heads, generator=torch.Generator().manual_seed(key)) < P)
    return torch.stack(rows)


def per_step_masks(model, seed=0, **kwargs):
    abl = RandomAblation(P, seed=seed)
    out = generate(model, PROMPTS, ablation=abl, decision="per_step", progress=False, **kwargs)
    return out, abl.stats.masks


def test_ids_and_heads_do_not_depend_on_max_new_tokens_or_batch_size(model):
    short, short_masks = per_step_masks(model, max_new_tokens=2, batch_size=3)
    long, long_masks = per_step_masks(model, max_new_tokens=5, batch_size=1)
    assert set(short_masks) == {p + (t << 32) for p in range(3) for t in range(2)}
    assert set(short_masks) < set(long_masks)
    for seq, mask in short_masks.items():
        assert torch.equal(mask, long_masks[seq]), seq
    # the same heads, hence the same first tokens
    assert [t[:2] for t in long.tokens] == short.tokens


def test_heads_match_the_documented_rule_by_hand(model):
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    _, masks = per_step_masks(model, seed=7, max_new_tokens=3)
    for p in range(3):
        for t in range(3):
            assert torch.equal(masks[p + (t << 32)], by_hand(7, p, t, n_layers, n_heads)), (p, t)


def test_the_prompt_decision_is_the_first_step_of_per_step(model):
    abl = RandomAblation(P, seed=2)
    generate(model, PROMPTS, ablation=abl, decision="prompt", max_new_tokens=2, progress=False)
    _, masks = per_step_masks(model, seed=2, max_new_tokens=2)
    for p in range(3):
        assert torch.equal(abl.stats.masks[p], masks[p])


def test_ids_differ_across_seeds(model):
    _, zero = per_step_masks(model, seed=0, max_new_tokens=3)
    _, one = per_step_masks(model, seed=1, max_new_tokens=3)
    assert set(zero) == set(one)
    assert sum(not torch.equal(zero[s], one[s]) for s in zero) >= len(zero) - 1


def test_large_ids_do_not_alias_with_the_next_seed():
    """The old key (seed * 1_000_003 + id) << 12 gave seed 0, id 1_000_003 + i the draw of seed 1, id i."""
    for i, layer in [(0, 0), (5, 2), (999_999, 11)]:
        assert random_key(0, 1_000_003 + i, layer) != random_key(1, i, layer)
    assert random_key(3, 17, 4) == ((3 * 1_000_003 + 17) << 12) + 4  # likelihood ids keep their draws
