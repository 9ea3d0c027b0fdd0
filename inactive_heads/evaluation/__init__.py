"""Stage 7, evaluation: the benchmarks offline (MMLU, PIQA, WinoGrande, lm-eval tasks), lm-eval
0.4.5's prompts, planning forward inputs once, and the batch scorer behind ``evaluate``."""

from .evaluator import EvalPlan, EvalResult, evaluate, plan_evaluation
from .tasks import TASKS, build_requests, load_docs
