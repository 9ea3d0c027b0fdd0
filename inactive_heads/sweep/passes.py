"""The model side of a sweep: its model, its inputs (tokenized once), and one pass over them.

Both executors load the model with :func:`load_model_for`, plan the inputs with :func:`plan_for`
and run every pass (the baseline, recording the calibration scores, or one ablation; the whole
plan or a Ray shard of it) through :func:`evaluate_run`, so a sweep's pass is configured in one place.
"""

from ..core.errors import UserError
from .config import SweepConfig


def resolved_for(config: SweepConfig, model) -> SweepConfig:
    """``config`` resolved by the model that runs it: its dtype and its device's type."""
    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    return config.resolved(dtype=model_info(model).dtype, device=str(model_device(model)))


def load_model_for(config: SweepConfig, progress: bool = True):
    from ..models.loading import load_model

    return load_model(config.model, backend=config.backend, dtype=config.dtype, device=config.device,
                      n_ctx=config.n_ctx, progress=progress)


def check_model_matches(config: SweepConfig, model) -> None:
    """A model passed to :func:`run_sweep` must be the one the config describes (dtype, backend, n_ctx, device)."""
    from ..models.devices import resolve_device
    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    info = model_info(model)
    wanted = {
        "dtype": None if config.dtype == "auto" else config.dtype,
        "backend": None if config.backend == "auto" else config.backend,
        "n_ctx": config.n_ctx,
        "device": None if config.device is None else resolve_device(config.device),
    }
    actual = {"dtype": info.dtype, "backend": info.backend, "n_ctx": info.n_ctx, "device": str(model_device(model))}
    if actual["device"] == "cuda":
        actual["device"] = "cuda:0"
    for key, want in wanted.items():
        if want is not None and actual[key] != want:
            raise UserError(f"the model passed to run_sweep has {key} {actual[key]!r} but the sweep config says "
                             f"{want!r}; load it with load_model(..., {key}={want!r}) or change the config")


def plan_for(config: SweepConfig, model):
    """The sweep's inputs, tokenized once: an ``EvalPlan``, or for a generation task the list of
    :class:`~inactive_heads.evaluation.gsm8k.GenerationRequest`."""
    from ..evaluation.registry import plan_for_task

    plan = plan_for_task(model, config.task, subjects=config.subjects, limit=config.limit,
                         num_fewshot=config.num_fewshot, apply_chat_template=config.apply_chat_template,
                         source=config.source)
    return questions_from(plan, config.questions_from, "questions_from") if config.questions_from else plan


def questions_from(plan, first: int, option: str):
    """The part of ``plan`` whose questions are at index ``first`` or later within their subject
    (their split, for a task of one subject), in the plan's order (:func:`question_window`): an
    ``EvalPlan``'s inputs, or a generation task's requests. ``option`` names the setting in the
    error for an empty part."""
    chosen = question_window(plan, first)
    if not chosen:
        raise UserError(f"the task has no question at index {first} or later ({option}); choose an index below "
                        "the number of questions of each subject")
    return plan.subset(chosen) if _is_plan(plan) else [plan[i] for i in chosen]


def question_window(plan, first: int) -> list[int]:
    """The indices of ``plan``'s inputs (a generation task's requests) whose question is at index
    ``first`` or later within its subject."""
    if not _is_plan(plan):  # a generation task's requests: one per question
        return [i for i, position in enumerate(_positions(plan)) if position >= first]
    position = _positions(plan.requests)
    return [i for i, targets in enumerate(plan.targets) if position[targets[0][0]] >= first]


def _is_plan(plan) -> bool:
    from ..evaluation.plan import EvalPlan

    return isinstance(plan, EvalPlan)


def _positions(requests) -> list[int]:
    """Each question's index within its subject (its split for a task of one subject)."""
    position, seen = [], {}
    for req in requests:
        subject = getattr(req, "subject", None)
        position.append(seen.get(subject, 0))
        seen[subject] = position[-1] + 1
    return position


def sweep_inputs(config: SweepConfig, plan) -> list[list[int]]:
    """The token ids the scores are recorded on: the plan's inputs, or a generation task's prompts."""
    return [list(r.context_ids) for r in plan] if config.is_generation else plan.inputs


def scores_description(config: SweepConfig, plan) -> str:
    if config.is_generation:
        return f"{config.task} prompts ({len(plan)})"
    return f"{config.task} evaluation inputs ({len(plan.inputs)})"


def evaluate_run(config: SweepConfig, model, plan, ablation, *, progress: bool, record=None, prompt_ids=None,
                 bar=None):
    """One pass of the sweep (the baseline, with ``record``, or one ablation) with the sweep's options.

    A generation task generates (:func:`~inactive_heads.evaluation.generation.evaluate_generation`,
    ``config.decision``); its scores for calibration are recorded on the prompts, nothing zeroed,
    in the exact form (:func:`~inactive_heads.scoring.recording.record_scores`). ``prompt_ids``
    (generation only): each request's index in the whole sweep, when ``plan`` is a part of it.
    ``bar`` (log-likelihood tasks): the sweep's progress bar, advanced per input, in place of the pass's own."""
    if not config.is_generation:
        from ..evaluation.evaluator import evaluate

        return evaluate(
            model, plan, ablation=ablation, batch_size=config.batch_size, progress=progress,
            reuse_prefix=config.reuse_prefix, attention=config.evaluate_attention, record=record,
            record_description=scores_description(config, plan) if record else None, bar=bar)
    from ..evaluation.generation import evaluate_generation

    result = evaluate_generation(model, config.task, ablation=ablation, decision=config.decision,
                                 limit=config.limit, num_fewshot=config.num_fewshot,
                                 apply_chat_template=config.apply_chat_template, max_gen_toks=config.max_gen_toks,
                                 reuse_prefix=config.reuse_prefix, batch_size=config.batch_size, progress=progress,
                                 requests=plan, prompt_ids=prompt_ids)
    result.head_scores = record_prompt_scores(config, model, plan, record, progress) if record else None
    return result


def record_prompt_scores(config: SweepConfig, model, requests, keys, progress: bool):
    """Scores for calibrating a generation sweep: recorded on its prompts, nothing zeroed."""
    from ..scoring.recording import record_scores

    return record_scores(model, sweep_inputs(config, requests), list(keys), batch_size=config.batch_size,
                         progress=progress, description=scores_description(config, requests))


def calibration_plan(config: SweepConfig, model):
    """The questions static sets are chosen on: ``config.static_calibration`` = [first, end) of the
    task (of each MMLU subject), tokenized as the evaluation's."""
    from ..evaluation.registry import plan_for_task

    first, end = config.static_calibration
    plan = plan_for_task(model, config.task, subjects=config.subjects, limit=end, num_fewshot=config.num_fewshot,
                         apply_chat_template=config.apply_chat_template, source=config.source)
    return questions_from(plan, first, f"static_calibration {config.static_calibration}")

