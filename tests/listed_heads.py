"""A user's ablation written from scratch (not with StaticAblation): zero the listed (layer, head)
pairs at every position. Unregistered here: each test registers a subclass under its own kind,
so tests cannot see each other's kinds."""

import torch

import inactive_heads as ih


def listed_head_flags(acts, heads) -> torch.Tensor:
    """``[batch, head]`` flags: True for the listed heads of ``acts.layer``."""
    flags = torch.zeros((acts.z.shape[0], acts.n_heads), dtype=torch.bool, device=acts.z.device)
    for layer, head in heads:
        if layer == acts.layer:
            flags[:, head] = True
    return flags


class ZeroListedHeads(ih.HeadAblation):
    """Zero the listed heads; its spec is ``{"kind": ..., "heads": [[layer, head], ...]}``."""

    def __init__(self, heads):
        super().__init__()
        self.heads = [[int(layer), int(head)] for layer, head in heads]

    def params(self):
        return {"heads": self.heads}

    def decide(self, acts):
        return listed_head_flags(acts, self.heads)
