"""Stage 2, runtime: the per-layer hook runner over ``hook_pattern`` / ``hook_v`` / ``hook_z``, the
attention forms (TransformerLens's exact arithmetic or the fused kernel) and shared-prefix reuse."""

# The line adapters first: they register themselves with lines.base, which every runtime module asks.
from .lines import bridge as _bridge_line  # noqa: F401  (registers the TransformerBridge line)
from .lines import hooked as _hooked_line  # noqa: F401  (registers the HookedTransformer line)
from .lines import other as _other_line  # noqa: F401  (registers the fallback)
from .activations import LayerActivations
from .hooks import HeadHookRunner, hook_name, run_forward
