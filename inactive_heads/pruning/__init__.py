"""Stage 5, pruning (between ablation and analysis): from inactive heads to real savings.

:func:`~.static.static_heads` turns recorded per-input scores into one fixed set of heads,
:func:`~.export.export_pruned` writes a checkpoint without them (zeroed or physically pruned,
loadable by plain ``transformers`` and lm-eval), and :mod:`.accountant` counts what removing them
saves (parameters, FLOPs per token, KV-cache bytes), per input for dynamic runs too.
"""

from .accountant import (  # noqa: F401
    KV_LENGTHS,
    ModelShape,
    Savings,
    held_fractions,
    model_shape,
    oracle_savings,
    paper_model_shapes,
    paper_projections,
    removal_counts,
    savings,
)
from .export import MODES, export_pruned, kept_heads  # noqa: F401
from .static import RULES, HeadSet, static_heads  # noqa: F401
