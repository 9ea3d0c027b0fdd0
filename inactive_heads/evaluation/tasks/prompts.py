"""A task's prompt strings, built as lm-eval 0.4.5 builds them (lm_eval/api/task.py
``ConfigurableTask.fewshot_context``, lm_eval/api/samplers.py ``ContextSampler``): the description,
few-shot examples joined by the task config's delimiters, the chat template
(``fewshot_as_multiturn``), and the choice of few-shot examples."""

import random
from collections.abc import Callable
from typing import Any

from ...core.errors import UserError
from .task import Task

# lm-eval 0.4.5 TaskConfig defaults (lm_eval/api/task.py), used by every built-in task.
TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
# lm_eval.evaluator.simple_evaluate(fewshot_random_seed=1234).
FEWSHOT_SEED = 1234


def _gold(task: Task, doc: dict) -> int:
    if task.multiple_input:
        return int(task.doc_to_text(doc))
    return int(task.doc_to_target(doc))


def _fewshot_pair(task: Task, doc: dict) -> tuple[str, str]:
    """(example text, target text) of a few-shot example, as ContextSampler renders them."""
    text = task.doc_to_text(doc)
    if isinstance(text, int):
        text = task.doc_to_choice(doc)[text]
    target = task.doc_to_target(doc)
    if isinstance(target, int):
        target = str(task.doc_to_choice(doc)[target])
    return text, target


def _render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    # HFLM.apply_chat_template in lm-eval 0.4.5.
    if not messages:
        raise UserError(
            "the chat prompt would be an empty conversation (WinoGrande 0-shot with a chat "
            "template: lm-eval renders only the few-shot turns before the filled-in sentence); "
            "transformers cannot render an empty conversation, use num_fewshot >= 1"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _contexts(
    task: Task,
    doc: dict,
    description: str,
    shots: list[dict],
    chat: Callable[[list[dict[str, str]]], str] | None,
) -> list[str]:
    """The context string of each choice (one shared string unless the task is multiple-input)."""
    if chat is None:
        prompt = description
        for shot in shots:
            text, target = _fewshot_pair(task, shot)
            prompt += text
            if target != "":
                prompt += TARGET_DELIMITER + target + FEWSHOT_DELIMITER
        if task.multiple_input:
            return [prompt + c for c in task.doc_to_choice(doc)]
        return [prompt + str(task.doc_to_text(doc))]

    # apply_chat_template=True, fewshot_as_multiturn=True: description as the system turn,
    # each example a user turn (the example text) and an assistant turn (the bare target).
    messages: list[dict[str, str]] = []
    if description:
        messages.append({"role": "system", "content": description})
    for shot in shots:
        text, target = _fewshot_pair(task, shot)
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": target})
    if task.multiple_input:
        # lm-eval returns the rendered history (ending in the generation prompt) and appends the
        # filled-in sentence to it, outside any user turn.
        rendered = chat(messages)
        return [rendered + c for c in task.doc_to_choice(doc)]
    messages.append({"role": "user", "content": str(task.doc_to_text(doc))})
    return [chat(messages)]


def _continuations(task: Task, doc: dict) -> list[str]:
    # construct_requests: the target delimiter is kept in chat mode too in 0.4.5.
    if task.multiple_input:
        cont = str(task.doc_to_target(doc))
        return [TARGET_DELIMITER + cont for _ in task.doc_to_choice(doc)]
    return [TARGET_DELIMITER + c for c in task.doc_to_choice(doc)]


def _select_shots(
    task: Task,
    doc: dict,
    fewshot_docs: list[dict],
    num_fewshot: int,
    rnd: random.Random,
) -> list[int]:
    """ContextSampler.get_context's choice of examples, as indices into ``fewshot_docs``."""
    if num_fewshot == 0:
        return []
    n_samples = num_fewshot + 1 if task.draws_extra else num_fewshot
    if n_samples > len(fewshot_docs):
        raise UserError(
            f"num_fewshot={num_fewshot} needs {n_samples} few-shot examples but the "
            f"{task.name} {task.fewshot_split} split has {len(fewshot_docs)}"
        )
    if task.fewshot_sampler == "first_n":
        drawn = list(range(n_samples))
    else:
        # random.sample only uses len() and indexing of the population, so sampling indices
        # gives the same picks as lm-eval's rnd.sample(list_of_docs, n).
        drawn = rnd.sample(range(len(fewshot_docs)), n_samples)
    return [i for i in drawn if fewshot_docs[i] != doc][:num_fewshot]
