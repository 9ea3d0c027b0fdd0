"""The public task type and its registry: :class:`Task`, :func:`register_task`, :func:`registered_task`.

A task carries its behaviour: where its documents come from (per split), how a document becomes
prompt text, answer choices and a target, how few-shot examples are drawn, whether it is scored by
log-likelihood of its choices (``multiple_choice``) or by generating (``generation``), its metrics
and its default number of few-shot examples. The built-in tasks (:mod:`.builtin`) are registered
with :func:`register_task` as a user's task is; every list of task names is read from the registry.
``lm-eval:<task>`` names an lm-eval task (kind ``lm-eval``): described by
:func:`~inactive_heads.evaluation.registry.get_task`, never registered.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...core.errors import UserError, WrongTypeError

KINDS = ("multiple_choice", "generation")
"""The kinds a registered task can have: scored by the log-likelihood of each answer choice, or by
an answer the model generates. (``lm-eval`` is the kind of an ``lm-eval:<task>`` name.)"""

METRICS = ("acc", "acc_norm", "exact_match")
"""The metrics a task can declare: ``acc`` (the answer with the largest log-likelihood is the gold
one), ``acc_norm`` (the same with each log-likelihood divided by the answer's length in characters,
lm-eval's ``acc_norm``), ``exact_match`` (a generated answer equals the gold one after the task's
answer extraction and normalization)."""

SAMPLERS = ("default", "first_n")
"""How few-shot examples are drawn (lm-eval's samplers): ``default`` = ``random.Random(seed).sample``
of the few-shot split, the generator advanced once per evaluated document in order; ``first_n`` =
the first examples of the few-shot split."""

LM_EVAL_TASK = "lm-eval:"
"""The prefix of an lm-eval task name (``"lm-eval:arc_easy"``): its requests come from lm-eval."""

DocsLoader = Callable[[str, "str | None"], "Sequence[dict] | None"]


@dataclass(frozen=True)
class Task:
    """A task and its behaviour, registered with :func:`register_task` (docs/tasks.md shows one).

    A ``multiple_choice`` task needs ``docs`` and the three ``doc_to_*`` callables, as lm-eval's
    task config has them: ``doc_to_text(doc)`` is the question text (or, for a task whose choices
    differ in the context, ``multiple_input=True``, the gold index), ``doc_to_choice(doc)`` the answer
    strings, ``doc_to_target(doc)`` the gold index (or, with ``multiple_input``, the shared answer
    text). The prompt is ``description`` + few-shot examples (text, ``" "``, target, ``"\\n\\n"``)
    + ``doc_to_text(doc)``; each answer is ``" " + choice``. ``docs`` is a mapping ``{split: rows}``
    or a callable ``(split, subject) -> rows | None`` (None: the task has no such split);
    ``eval_split`` is the split evaluated, ``fewshot_split`` the one few-shot examples come from,
    ``fewshot_sampler`` one of :data:`SAMPLERS`, ``draws_extra`` draws one example more and drops the
    evaluated document if drawn (lm-eval does when both splits are the same config key).
    ``subjects``: the names of a task made of subtasks (MMLU's subjects; ``description`` may then
    be a callable of the subject). ``fields``: what a document of a user ``source=`` must hold;
    ``hub_config``: the config name of its Hugging Face data set. A ``generation`` task needs
    ``build_generation`` (tokenizer and options to generation requests), ``extract_answers``
    (a generation to ``{filter: answer}``, the first one scored as ``accuracy``) and
    ``answer_matches(answer, gold)``. ``metrics`` (of :data:`METRICS`) are what a result
    reports, the primary one first; ``num_fewshot`` the default; ``data`` and ``prompt`` say in
    words where documents come from and how prompts are built.
    """

    name: str
    kind: str = "multiple_choice"
    docs: Mapping[str, Sequence[dict]] | DocsLoader | None = field(default=None, repr=False)
    doc_to_text: Callable[[dict], str | int] | None = field(default=None, repr=False)
    doc_to_choice: Callable[[dict], list[str]] | None = field(default=None, repr=False)
    doc_to_target: Callable[[dict], str | int] | None = field(default=None, repr=False)
    eval_split: str = "test"
    fewshot_split: str | None = "train"
    fewshot_sampler: str = "default"
    draws_extra: bool = False
    multiple_input: bool = False
    description: str | Callable[[str | None], str] = field(default="", repr=False)
    subjects: tuple[str, ...] = field(default=(), repr=False)
    fields: tuple[str, ...] = ()
    hub_config: str | None = None
    metrics: tuple[str, ...] = ("acc",)
    num_fewshot: int | None = 0
    data: str = field(default="", repr=False)
    prompt: str = field(default="", repr=False)
    build_generation: Callable[..., list] | None = field(default=None, repr=False)
    extract_answers: Callable[[str], dict[str, str]] | None = field(default=None, repr=False)
    answer_matches: Callable[[str, str], bool] | None = field(default=None, repr=False)
    max_gen_toks: int | None = None

    def __post_init__(self):
        if isinstance(self.metrics, str) or not isinstance(self.metrics, (tuple, list)):
            raise WrongTypeError(f"task metrics must be a tuple such as ('acc', 'acc_norm'), got {self.metrics!r}")
        for name in ("metrics", "subjects", "fields"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def primary_metric(self) -> str:
        """The metric in ``result.accuracy`` (``acc``, or ``exact_match`` for a generation task)."""
        return self.metrics[0]

    def load_split(self, split: str, subject: str | None = None) -> list[dict] | None:
        """The rows of one split of the task's own data (``docs``), or None when it has none."""
        rows = self.docs(split, subject) if callable(self.docs) else (self.docs or {}).get(split)
        return None if rows is None else list(rows)

    def describe(self, subject: str | None) -> str:
        """The text before the few-shot examples (lm-eval's ``description``)."""
        return self.description(subject) if callable(self.description) else self.description

    def check(self) -> "Task":
        """The task's declaration checked (:func:`register_task` does): one line naming what is wrong."""
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise UserError(f"a task name is a non-empty string without surrounding spaces, got {self.name!r}")
        if self.name.startswith(LM_EVAL_TASK):
            raise UserError(f"task names starting with {LM_EVAL_TASK!r} are lm-eval's; choose another name "
                            f"than {self.name!r}")
        if self.kind not in KINDS:
            raise UserError(f"task {self.name!r}: unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")
        allowed = ("acc", "acc_norm") if self.kind == "multiple_choice" else ("exact_match",)
        if not self.metrics or self.metrics[0] != allowed[0] or not all(m in allowed for m in self.metrics):
            raise UserError(f"task {self.name!r}: a {self.kind} task's metrics are {allowed[0]!r}"
                            + (", then optionally 'acc_norm'" if len(allowed) > 1 else "") + f"; got {self.metrics!r}")
        shots = self.num_fewshot
        if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
            raise UserError(f"task {self.name!r}: num_fewshot must be a non-negative integer, got {shots!r}")
        needed = (("docs", "doc_to_text", "doc_to_choice", "doc_to_target") if self.kind == "multiple_choice"
                  else ("build_generation", "extract_answers", "answer_matches"))
        missing = [n for n in needed if getattr(self, n) is None]
        if missing:
            raise UserError(f"task {self.name!r}: a {self.kind} task needs {', '.join(missing)}")
        if self.fewshot_sampler not in SAMPLERS:
            raise UserError(f"task {self.name!r}: unknown fewshot_sampler {self.fewshot_sampler!r}; use one of "
                            f"{', '.join(SAMPLERS)}")
        if self.docs is not None and not (callable(self.docs) or isinstance(self.docs, Mapping)):
            raise WrongTypeError(f"task {self.name!r}: docs must be a mapping {{split: rows}} or a callable "
                                 f"(split, subject) -> rows, got {type(self.docs).__name__}")
        return self


_REGISTRY: dict[str, Task] = {}
_BUILTIN: set[str] = set()


def register_task(task: Task, *, overwrite: bool = False, _builtin: bool = False) -> Task:
    """Add ``task`` to the registry, so that every entry point takes it by name (``ih.evaluate``,
    sweeps, Ray workers that import the module registering it). Returns the task.

    A built-in name cannot be taken; a name already registered needs ``overwrite=True``.
    """
    if not isinstance(task, Task):
        raise WrongTypeError(f"register_task takes an ih.Task, got {type(task).__name__}")
    task.check()
    if task.name in _BUILTIN:
        raise UserError(f"{task.name!r} is a built-in task and cannot be replaced; choose another name")
    if task.name in _REGISTRY and not overwrite:
        raise UserError(f"task {task.name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[task.name] = task
    if _builtin:
        _BUILTIN.add(task.name)
    return task


def unregister_task(name: str) -> None:
    """Remove a registered task (the built-in tasks stay)."""
    if not isinstance(name, str):
        raise WrongTypeError(f"unregister_task takes a task name, got {type(name).__name__}")
    if name in _BUILTIN:
        raise UserError(f"{name!r} is a built-in task and cannot be removed")
    if name not in _REGISTRY:
        raise UserError(f"task {name!r} is not registered; registered: {', '.join(_REGISTRY)}")
    del _REGISTRY[name]


def task_names(kind: str | None = None, *, builtin: bool | None = None) -> tuple[str, ...]:
    """The registered task names, in registration order (built-in first), optionally of one kind
    and only (or never) the built-in ones."""
    return tuple(name for name, task in _REGISTRY.items() if (kind is None or task.kind == kind)
                 and (builtin is None or (name in _BUILTIN) == builtin))


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of the toolkit's own tasks."""
    return name in _BUILTIN


def registered_task(name: str) -> Task:
    """The task registered as ``name`` (a built-in or a user's); an unknown name is
    :func:`task_kind`'s one-line error. (``ih.get_task`` also describes ``lm-eval:<task>`` names.)"""
    if task_kind(name) == "lm-eval":
        raise UserError(f"{name} is an lm-eval task, not a registered one; describe it with ih.get_task({name!r})")
    return _REGISTRY[name]


def task_kind(task: str) -> str:
    """The kind of a task name, the one check every entry point makes: a registered task's
    (``"multiple_choice"`` or ``"generation"``) or ``"lm-eval"`` (``lm-eval:<task>``, an lm-eval
    multiple-choice task); anything else is a one-line error listing every kind accepted.

    >>> task_kind("piqa"), task_kind("gsm8k"), task_kind("lm-eval:arc_easy")
    ('multiple_choice', 'generation', 'lm-eval')
    """
    if isinstance(task, str) and task in _REGISTRY:
        return _REGISTRY[task].kind
    if isinstance(task, str) and task.startswith(LM_EVAL_TASK) and len(task) > len(LM_EVAL_TASK):
        return "lm-eval"
    raise UserError(f"unknown task {task!r}; known: {', '.join(task_names('multiple_choice'))} (multiple choice), "
                    f"{', '.join(task_names('generation'))} (generation), or lm-eval:<task> (an lm-eval "
                    "multiple-choice task, e.g. lm-eval:arc_easy)")
