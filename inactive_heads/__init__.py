"""inactive-heads: find and test inactive attention heads in pretrained LLMs with TransformerLens.

Implements the method of Sandoval-Segura et al., "Identifying and Evaluating Inactive Heads in
Pretrained LLMs" (ICLR 2026): score every head, pick quantile thresholds, zero flagged heads'
outputs at ``hook_z`` inside the forward pass, and measure benchmark accuracy.
"""

from .models import BUILTIN_MODELS, DEFAULT_MODEL, ModelInfo, ModelLoadError, load_model, model_info
from .recording import HeadScores, record_scores
from .scores import (
    PAPER_SCORES,
    LayerActivations,
    ScoreFunction,
    get_score,
    layer_normalize,
    register_score,
    score_keys,
    unregister_score,
)

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "HeadScores",
    "LayerActivations",
    "ModelInfo",
    "ModelLoadError",
    "PAPER_SCORES",
    "ScoreFunction",
    "get_score",
    "layer_normalize",
    "load_model",
    "model_info",
    "record_scores",
    "register_score",
    "score_keys",
    "unregister_score",
]
