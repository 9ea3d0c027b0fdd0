"""A causal predictor of the in-pass oracle and the ablation that runs it (:class:`PredictedAblation`)."""

from .ablation import PredictedAblation
from .probe import FitOptions, Predictor, PredictorConfig, compare, fit_predictor, pooled_features

__all__ = ["FitOptions", "PredictedAblation", "Predictor", "PredictorConfig", "compare", "fit_predictor",
           "pooled_features"]
