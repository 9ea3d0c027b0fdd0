"""The one dispatch from a task name to its requests: :func:`plan_for_task`, by the task's kind.

Every entry point that takes a task by name — :func:`~inactive_heads.evaluate`,
:func:`~inactive_heads.plan_evaluation`, sweeps (their plan and their static-calibration plan),
``inactive-heads score`` — goes through :func:`plan_for_task`. What a task is (its kind, data,
prompts, metrics) is its :class:`~inactive_heads.evaluation.tasks.Task`, registered with
:func:`~inactive_heads.evaluation.tasks.register_task`; :func:`task_spec` reads it by name.

Three kinds, one planner each: ``multiple_choice`` (requests built by
:func:`~inactive_heads.evaluation.tasks.build_requests` from the task's data and prompts),
``generation`` (the task's ``build_generation``) and ``lm-eval`` (``lm-eval:<task>``, requests
built by lm-eval: :func:`~inactive_heads.evaluation.lm_eval_tasks.plan_lm_eval_task`). A plan
carries its task's metrics (:attr:`EvalPlan.metrics`), and
:func:`~inactive_heads.evaluation.evaluator.summarize` reports exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ..core.errors import UserError
from ..models.loading import model_info
from .gsm8k import GenerationRequest  # importing it registers the gsm8k task
from .plan import EvalPlan, index_forward_inputs
from .tasks import (METRICS, Task, _check_limit, build_requests, is_builtin, load_docs, registered_task, task_kind,
                    task_names)

TaskSpec = Task
"""The earlier name of :class:`~inactive_heads.evaluation.tasks.Task` (the same type)."""


def get_task(name: str) -> Task:
    """What a task declares, by name: the registered task (built-in or a user's), or for
    ``"lm-eval:<task>"`` the lm-eval task's declaration (kind ``lm-eval``, its metric list read
    through lm-eval, which must be installed). An unknown name is a one-line error listing every kind
    of task accepted.

    >>> task = get_task("piqa")
    >>> task.kind, task.metrics, task.primary_metric
    ('multiple_choice', ('acc', 'acc_norm'), 'acc')
    """
    if task_kind(name) == "lm-eval":
        return _lm_eval_task(name)
    return registered_task(name)


task_spec = get_task
"""The earlier name of :func:`get_task`."""


@lru_cache(maxsize=64)
def _lm_eval_task(name: str) -> Task:
    from .lm_eval_tasks import lm_eval_task_facts

    facts = lm_eval_task_facts(name)
    return Task(name, "lm-eval", metrics=facts["metrics"], data=facts["data"],
                prompt="lm-eval's own (the task's doc_to_text, doc_to_choice and few-shot settings)",
                num_fewshot=facts["num_fewshot"])


BUILTIN_TASKS: dict[str, Task] = {name: registered_task(name) for name in task_names() if is_builtin(name)}
"""The built-in tasks by name (registered like any other: :mod:`~inactive_heads.evaluation.tasks.builtin`)."""


def check_task_options(task: str, *, subjects: Sequence[str] | None = None, limit: int | None = None,
                       source: str | None = None) -> None:
    """The checks of a task's options that need no model, by name: options the task does not take
    are refused, and a multiple-choice task reads its documents (so a bad subject, limit or source
    fails before a model loads). An lm-eval task's declaration is not read (that loads its
    documents). What the score command checks before the model loads."""
    kind = task_kind(task)
    _refuse_options(task, kind, subjects, source)
    if kind == "multiple_choice":
        load_docs(task, subjects=subjects, limit=limit, source=source)
    else:
        _check_limit(limit)


def _refuse_options(task: str, kind: str, subjects, source) -> None:
    if subjects is None and source is None:
        return
    if kind == "lm-eval":
        raise UserError(f"subjects and source apply to the built-in tasks; {task} takes lm-eval's own "
                        "documents (name a subtask instead, e.g. lm-eval:mmlu_anatomy)")
    if kind == "generation":
        raise UserError(f"{task} is a generation task: subjects and source apply to "
                        "multiple-choice tasks; leave them unset")


def _plan_generation(model, task: str, info, chat: bool, *, limit, num_fewshot, **_):
    return registered_task(task).build_generation(model.tokenizer, limit=limit, num_fewshot=num_fewshot,
                                           apply_chat_template=chat, prepend_bos=info.prepend_bos)


def _plan_lm_eval(model, task: str, info, chat: bool, *, limit, num_fewshot, apply_chat_template, **_):
    from .lm_eval_tasks import plan_lm_eval_task

    return plan_lm_eval_task(model, task, limit=limit, num_fewshot=num_fewshot,
                             apply_chat_template=apply_chat_template)


def _plan_multiple_choice(model, task: str, info, chat: bool, *, subjects, limit, num_fewshot, source, **_):
    requests = build_requests(task, model.tokenizer, subjects=subjects, limit=limit, num_fewshot=num_fewshot,
                              apply_chat_template=chat, prepend_bos=info.prepend_bos, source=source)
    inputs, targets, n_truncated = index_forward_inputs(task, requests, info.n_ctx)
    config = {
        "model": info.name,
        "task": task,
        "subjects": list(subjects) if subjects is not None else None,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "apply_chat_template": chat,
        "prepend_bos": info.prepend_bos,
        "source": source,
    }
    return EvalPlan(task, requests, inputs, targets, config, n_truncated=n_truncated,
                    metrics=registered_task(task).metrics)


_PLANNERS = {"multiple_choice": _plan_multiple_choice, "generation": _plan_generation, "lm-eval": _plan_lm_eval}


def plan_for_task(
    model,
    task: str,
    *,
    subjects: Sequence[str] | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool | None = None,
    source: str | None = None,
) -> EvalPlan | list[GenerationRequest]:
    """A task's requests, built and tokenized once for ``model``: the one dispatch from a task name,
    by the task's kind.

    A multiple-choice task (registered or ``lm-eval:<task>``) gives an :class:`EvalPlan` carrying the
    task's metrics; a generation task (``gsm8k``) gives its
    :class:`~inactive_heads.evaluation.gsm8k.GenerationRequest` list. ``subjects`` (MMLU) and
    ``source`` apply to the registered multiple-choice tasks only; ``apply_chat_template=None`` is on
    for chat models. An unknown task is a one-line error listing every kind accepted.
    """
    kind = task_kind(task)
    _refuse_options(task, kind, subjects, source)
    info = model_info(model)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    return _PLANNERS[kind](model, task, info, chat, subjects=subjects, limit=limit, num_fewshot=num_fewshot,
                           apply_chat_template=apply_chat_template, source=source)


__all__ = ["BUILTIN_TASKS", "METRICS", "TaskSpec", "check_task_options", "get_task", "plan_for_task", "task_spec"]
