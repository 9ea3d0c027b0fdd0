"""Stage 4, ablation: zeroing heads at ``hook_z`` — static sets, the paper's in-pass dynamic
thresholds, Random, and your own subclasses of :class:`HeadAblation`."""

from .head_ablation import (
    AblationSpec,
    AblationStats,
    DynamicAblation,
    HeadAblation,
    RandomAblation,
    StaticAblation,
    ablation_from_spec,
    ablation_kinds,
    register_ablation,
    unregister_ablation,
    zero_heads_hook,
)
from .coerce import CalibratedAblation, as_ablation, parse_ablation
