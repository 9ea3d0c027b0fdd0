"""Stage 4, ablation: zeroing heads at ``hook_z`` — static sets, the paper's in-pass dynamic
thresholds, Random, and your own subclasses of :class:`HeadAblation`."""

from .head_ablation import (
    AblationSpec,
    AblationStats,
    DynamicAblation,
    HeadAblation,
    RandomAblation,
    StaticAblation,
    zero_heads_hook,
)
