"""Stage 3, scoring: the score registry (the paper's 13 functions and Random), recording per-sequence
scores into :class:`HeadScores` files, and calibrating quantile thresholds."""

from .calibration import DEFAULT_QUANTILES, Thresholds, calibrate, calibrate_on, official_models, official_thresholds
from .recording import HeadScores, record_scores
from .scores import PAPER_SCORES, ScoreFunction, get_score, register_score, score_keys, unregister_score
