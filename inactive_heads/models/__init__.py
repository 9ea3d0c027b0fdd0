"""Stage 1, models: the built-in models (GGUF in registry packages, converted once), loading a
HookedTransformer or TransformerBridge faithfully, and choosing device and dtype."""

from .devices import DTYPES, resolve_device, resolve_dtype
from .loading import BACKENDS, BUILTIN_MODELS, DEFAULT_MODEL, ModelInfo, ModelLoadError, load_model, model_info
