"""Skipped heads on the real SmolLM2-135M equal the zeroing simulation to float64 rounding.

In float32 the two differ by float rounding amplified over 30 layers (about 1e-3 on logits up to
40), as much as float32 itself is off the exact values, so float32 cannot check an absolute 1e-4.
In float64 rounding is about 1e-12, and any wrong head, row or mask shows at once. The reference is
the simulation: every head computed by the model's own forward, the held ones zeroed at ``hook_z``
per row. The test runs on a ``HookedTransformer`` (TransformerLens 3.9), whose attention computes
in the model's dtype; Hugging Face's attention in a ``TransformerBridge`` takes its softmax in
float32 even in a float64 model (3e-4 to 4e-3 off SmolLM2's logits), so it cannot be the float64
reference."""

import pytest
import torch

from inactive_heads import load_model
from inactive_heads.pruning.skipping import skip_logits
from tests.reference_skipping import simulated


@pytest.mark.hooked
def test_skip_equals_the_simulation_in_float64_on_smollm2():
    model = load_model("smollm2-135m", backend="hooked", dtype="float32", progress=False).to(torch.float64)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 96), generator=gen)
    held = torch.rand(2, n_layers, n_heads, generator=gen) < 0.2  # each row its own set
    with torch.inference_mode():
        got = skip_logits(model, tokens, held=held, rule="skip")
        wrong = held.clone()
        wrong[1, n_layers // 2] = ~wrong[1, n_layers // 2]  # one layer of one row decided otherwise
        got_wrong = skip_logits(model, tokens, held=wrong, rule="skip")
    assert got.dtype == torch.float64
    want = simulated(model, tokens, None, held)
    assert float((got - want).abs().max()) <= 1e-9
    # the check can fail: one row's heads of one layer decided otherwise move its logits far past 1e-9,
    # and leave the other row's alone
    assert float((got_wrong[1] - want[1]).abs().max()) > 1e-3
    assert float((got_wrong[0] - want[0]).abs().max()) <= 1e-9
