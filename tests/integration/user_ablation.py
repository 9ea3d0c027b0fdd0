"""An ablation kind registered in user code, for the sweep tests of ``SweepConfig.ablations``: a
sweep (and each Ray worker) knows the kind only if it imports this module (``imports``)."""

import listed_heads

import inactive_heads as ih


@ih.register_ablation("zero_listed_heads")
class ZeroListedHeads(listed_heads.ZeroListedHeads):
    """Zero the listed (layer, head) pairs at every position; the mask is built here, not by
    StaticAblation."""
