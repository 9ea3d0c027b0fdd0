"""Stage 2, runtime: the per-layer hook runner over ``hook_pattern`` / ``hook_v`` / ``hook_z``, the
attention forms (TransformerLens's exact arithmetic or the fused kernel) and shared-prefix reuse."""

from .activations import LayerActivations
from .hooks import HeadHookRunner, hook_name, run_forward
