"""On top: lm-eval's ``inactive-heads`` model type and the ``inactive-heads-lm-eval`` command
(needs the ``[lmeval]`` extra)."""

from .model import InactiveHeadsLM, lm_eval_model, main
