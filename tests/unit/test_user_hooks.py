"""A user's own hook written for HookedTransformer (``fn(tensor, hook)`` on ``blocks.{l}.attn.hook_z``,
``hook_pattern``, ``hook_v``) runs unchanged on both TransformerLens lines, through the toolkit's
forward in every attention form.

The tiny GQA model is a ``HookedTransformer`` on 3.9 and a ``TransformerBridge`` over Llama on 4.
The shapes expected are the ones it was built with (6 query heads on 2 KV heads of 8 dims), and
zeroing a head at ``hook_z`` is checked against another mechanism: the same head's slice of the
output projection set to zero in the weights.
"""

from contextlib import contextmanager

import pytest
import torch

from inactive_heads.models.tl_line import is_hooked_transformer
from inactive_heads.runtime.hooks import run_forward
from tiny import tiny_gqa_model

N_HEADS, N_KV, D_HEAD = 6, 2, 8
LAYER, HEAD = 1, 4


@pytest.fixture(scope="module")
def model():
    return tiny_gqa_model(seed=3)


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(3, 97, (3, 11), generator=gen)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, 7:] = False  # right padding, as the toolkit batches
    valid[2, 4:] = False
    return tokens, valid


@contextmanager
def _output_weights_of_head_zeroed(model, layer: int, head: int):
    """The model with ``head``'s slice of layer ``layer``'s output projection set to zero."""
    if is_hooked_transformer(model):
        weight, part = model.blocks[layer].attn.W_O, (head,)  # [head, d_head, d_model]
    else:
        weight = model.original_model.model.layers[layer].self_attn.o_proj.weight  # [d_model, head * d_head]
        part = (slice(None), slice(head * D_HEAD, (head + 1) * D_HEAD))
    saved = weight.detach().clone()
    with torch.no_grad():
        weight[part] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def zero_one_head(z, hook):
    """A HookedTransformer-style ablation: ``hook.layer()`` picks the layer, the head axis is 2."""
    if hook.layer() == LAYER:
        z[:, :, HEAD] = 0.0
    return z


def zero_one_pattern(pattern, hook):
    """An edit of the pattern (``[batch, head, query, key]``): the head attends to nothing, so its
    output is zero too."""
    if hook.layer() == LAYER:
        pattern = pattern.clone()
        pattern[:, HEAD] = 0.0
    return pattern


@pytest.mark.parametrize("form", ["exact", "fast", "eager"])
@pytest.mark.parametrize("where, fn", [("z", zero_one_head), ("pattern", zero_one_pattern)])
def test_a_zeroing_hook_equals_zeroed_output_weights(model, batch, form, where, fn):
    tokens, valid = batch
    with _output_weights_of_head_zeroed(model, LAYER, HEAD):
        expected = run_forward(model, tokens, valid, attention=form)
    plain = run_forward(model, tokens, valid, attention=form)
    hooks = [(f"blocks.{layer}.attn.hook_{where}", fn) for layer in range(3)]
    with model.hooks(fwd_hooks=hooks):
        got = run_forward(model, tokens, valid, attention=form)
    assert (plain[valid] - expected[valid]).abs().max() > 1e-3  # the head matters
    assert (got[valid] - expected[valid]).abs().max() <= 1e-5


@pytest.mark.parametrize("form", ["exact", "fast", "eager"])
def test_reading_hooks_see_the_hooked_transformer_shapes(model, batch, form):
    tokens, valid = batch
    shapes: dict[tuple[int, str], tuple] = {}
    patterns = []

    def reader(kind):
        def hook(tensor, hook):
            shapes[(hook.layer(), kind)] = tuple(tensor.shape)
            if kind == "pattern":
                patterns.append(tensor.detach().clone())
        return hook

    hooks = [(f"blocks.{layer}.attn.hook_{kind}", reader(kind)) for layer in range(3)
             for kind in ("pattern", "v", "z")]
    with model.hooks(fwd_hooks=hooks):
        run_forward(model, tokens, valid, attention=form)
    b, n = tokens.shape
    for layer in range(3):
        assert shapes[(layer, "pattern")] == (b, N_HEADS, n, n)
        assert shapes[(layer, "v")] == (b, n, N_KV, D_HEAD)  # the KV heads, as HookedTransformer gives them
        assert shapes[(layer, "z")] == (b, n, N_HEADS, D_HEAD)
    # A pattern is causal softmax weights: rows sum to 1, nothing above the diagonal.
    for pattern in patterns:
        torch.testing.assert_close(pattern.sum(-1), torch.ones(b, N_HEADS, n), rtol=0, atol=1e-5)
        assert float(pattern.triu(1).abs().max()) == 0.0
