"""The reference that skipped heads are checked against: the zeroing simulation.

Every head is computed by the model's own forward and the held ones are zeroed at ``hook_z``, per
row (``evaluation.decoding.HeldHeads``), so nothing of the skipping code is involved."""

import torch

from inactive_heads.evaluation.decoding import HeldHeads
from inactive_heads.runtime.hooks import installed


def simulated(model, tokens, mask, held):
    """Logits with every head computed and the held ones (``held[row, layer, head]``) zeroed at hook_z."""
    zeroing = HeldHeads(model)
    zeroing.masks = held
    with installed(model, zeroing.hooks()), torch.no_grad():
        return model(tokens, attention_mask=mask)
