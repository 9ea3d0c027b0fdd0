"""inactive-heads: find and test inactive attention heads in pretrained LLMs with TransformerLens.

Implements the method of Sandoval-Segura et al., "Identifying and Evaluating Inactive Heads in
Pretrained LLMs" (ICLR 2026): score every head, pick quantile thresholds, zero flagged heads'
outputs at ``hook_z`` inside the forward pass, and measure benchmark accuracy.

    >>> import inactive_heads as ih                                         # doctest: +SKIP
    >>> model = ih.load_model("smollm2-135m")                               # doctest: +SKIP
    >>> scores = ih.record_scores(model, ["The cat sat on the mat."])       # doctest: +SKIP
    >>> ih.evaluate(model, "mmlu", subjects=["anatomy"], limit=10,
    ...             ablation=ih.DynamicAblation("ahon_ln", 0.5))            # doctest: +SKIP
"""

from .ablation.head_ablation import (
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
from .scoring.calibration import DEFAULT_QUANTILES, Thresholds, calibrate, official_models, official_thresholds
from .core.errors import (
    InactiveHeadsError,
    MissingDependencyError,
    MissingFileError,
    NonFiniteError,
    OutOfRangeError,
    UnknownNameError,
    UserError,
    WrongTypeError,
)
from .evaluation.evaluator import EvalPlan, EvalResult, evaluate, plan_evaluation
from .evaluation.generation import GenerationOutput, GenerationResult, evaluate_generation, generate
from .models.loading import BUILTIN_MODELS, DEFAULT_MODEL, ModelInfo, ModelLoadError, load_model, model_info
from .scoring.recording import HeadScores, record_scores
from .scoring.scores import (
    PAPER_SCORES,
    LayerActivations,
    ScoreFunction,
    get_score,
    layer_normalize,
    register_score,
    score_keys,
    unregister_score,
)
from .pruning import (
    HeadSet,
    ModelShape,
    Savings,
    export_pruned,
    oracle_savings,
    paper_projections,
    savings,
    static_heads,
)
from .prediction import PredictedAblation, Predictor
from .sweep.run import run_sweep
from .sweep.config import SweepConfig
from .sweep.results import SweepResults, load_results, sweep_results
from .evaluation.tasks import TASKS, Task, build_requests, load_docs, register_task, unregister_task
from .evaluation.registry import TaskSpec, get_task, plan_for_task, task_spec
from .evaluation.texts import lambada_passages, read_text_file

__all__ = [
    "AblationSpec",
    "AblationStats",
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "DEFAULT_QUANTILES",
    "DynamicAblation",
    "EvalPlan",
    "EvalResult",
    "GenerationOutput",
    "GenerationResult",
    "HeadAblation",
    "HeadScores",
    "HeadSet",
    "InactiveHeadsError",
    "MissingDependencyError",
    "MissingFileError",
    "LayerActivations",
    "ModelInfo",
    "ModelLoadError",
    "ModelShape",
    "NonFiniteError",
    "OutOfRangeError",
    "PAPER_SCORES",
    "PredictedAblation",
    "Predictor",
    "RandomAblation",
    "Savings",
    "ScoreFunction",
    "StaticAblation",
    "SweepConfig",
    "SweepResults",
    "TASKS",
    "Task",
    "TaskSpec",
    "Thresholds",
    "UnknownNameError",
    "UserError",
    "WrongTypeError",
    "ablation_from_spec",
    "ablation_kinds",
    "build_requests",
    "calibrate",
    "evaluate",
    "evaluate_generation",
    "generate",
    "export_pruned",
    "get_score",
    "layer_normalize",
    "load_docs",
    "load_results",
    "lambada_passages",
    "lm_eval_model",
    "load_model",
    "model_info",
    "official_models",
    "official_thresholds",
    "oracle_savings",
    "paper_projections",
    "plan_evaluation",
    "plan_for_task",
    "read_text_file",
    "record_scores",
    "register_ablation",
    "register_score",
    "run_sweep",
    "savings",
    "score_keys",
    "static_heads",
    "sweep_results",
    "task_spec",
    "register_task",
    "unregister_task",
    "get_task",
    "unregister_ablation",
    "unregister_score",
    "zero_heads_hook",
]


def __getattr__(name: str):
    # lm_eval_model needs the optional lm-eval extra: imported on first use, not with the package.
    if name == "lm_eval_model":
        from .lmeval.model import lm_eval_model

        return lm_eval_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
