"""An ablation kind registered in user code, for the sweep tests of ``SweepConfig.ablations``: a
sweep (and each Ray worker) knows the kind only if it imports this module (``imports``)."""

import torch

import inactive_heads as ih


@ih.register_ablation("zero_listed_heads")
class ZeroListedHeads(ih.HeadAblation):
    """Zero the listed (layer, head) pairs at every position; the mask is built here, not by
    StaticAblation."""

    def __init__(self, heads):
        super().__init__()
        self.heads = [[int(layer), int(head)] for layer, head in heads]

    def params(self):
        return {"heads": self.heads}

    def decide(self, acts):
        flags = torch.zeros((acts.z.shape[0], acts.n_heads), dtype=torch.bool, device=acts.z.device)
        for layer, head in self.heads:
            if layer == acts.layer:
                flags[:, head] = True
        return flags
