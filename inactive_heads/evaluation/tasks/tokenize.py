"""Requests and their tokens (lm_eval/api/model.py ``TemplateLM._encode_pair``,
lm_eval/models/huggingface.py): :class:`Choice` and :class:`Request`, and the tokenization that
turns prompt strings into the token ids lm-eval's ``HFLM`` would feed the model."""

from dataclasses import dataclass
from typing import Any

from .prompts import _gold
from .task import Task


@dataclass(frozen=True)
class Choice:
    """One (context, continuation) log-likelihood request, tokenized as lm-eval's ``HFLM`` does.

    ``context_ids`` and ``continuation_ids`` come from ``_encode_pair``: trailing whitespace of the
    context moves to the continuation, ``context + continuation`` is tokenized whole, and the
    continuation is the part of that after ``len(context_ids)`` tokens. The model input is
    ``(context_ids + continuation_ids)[:-1]`` (lm-eval keeps its last ``max_length + 1`` tokens
    before dropping the final one); the continuation's log-probability is read from the last
    ``len(continuation_ids)`` positions.

    ``continuation_text`` is the continuation string of lm-eval's request (before the whitespace
    move): ``" A"`` for MMLU, ``" " + solution`` for PIQA, ``" " + rest of sentence`` for
    WinoGrande. ``norm_length`` is lm-eval's ``acc_norm`` divisor: the character length of
    ``doc_to_choice(doc)[i]`` (without the delimiter; for WinoGrande the filled-in context).
    """

    context_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]
    continuation_text: str
    norm_length: int | None = None


@dataclass(frozen=True)
class Request:
    """All choices of one benchmark question.

    ``doc_id`` is the question's index in the evaluated split in dataset order; for MMLU it is a
    running index over the returned questions (subjects in the order given, each subject's
    questions in dataset order). ``context_text`` is the prompt string of choice 0 as lm-eval
    holds it (chat template applied, before the whitespace move). ``fewshot_ids`` are the indices
    of the few-shot examples in the few-shot split (MMLU dev, WinoGrande train), in prompt order.
    """

    task: str
    doc_id: int
    subject: str | None
    choices: tuple[Choice, ...]
    gold: int
    context_text: str
    fewshot_ids: tuple[int, ...] = ()


def _encode_batch(tokenizer: Any, texts: list[str], chunk: int = 512) -> list[list[int]]:
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        out.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
    return out


def _split_pair(context: str, continuation: str) -> tuple[str, str]:
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


_QUESTIONS_PER_BATCH = 512


def _tokenize(
    task: Task,
    tokenizer: Any,
    pending: list,
    bos: tuple[int, ...],
    first_n: int,
) -> list[Request]:
    texts: list[str] = []
    index: dict[str, int] = {}

    def slot(text: str) -> int:
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        return index[text]

    plans = []
    for _, _, _, contexts, conts, _ in pending:
        plan = []
        for ctx, cont in zip(contexts, conts):
            if ctx == "":
                # loglikelihood(): an empty context becomes the prefix token (BOS, else EOS).
                prefix = tokenizer.bos_token_id
                if prefix is None:
                    prefix = tokenizer.eos_token_id
                plan.append(("empty", int(prefix), slot(cont)))
            else:
                c, w = _split_pair(ctx, cont)
                plan.append(("pair", slot(c), slot(c + w)))
        plans.append(plan)
    encoded = _encode_batch(tokenizer, texts)

    requests: list[Request] = []
    shared: dict[int, tuple[int, ...]] = {}
    for n, ((subject, i, doc, contexts, conts, shot_ids), plan) in enumerate(
        zip(pending, plans), start=first_n
    ):
        norm = [len(c) for c in task.doc_to_choice(doc)]
        choices = []
        for k, (kind, a, b) in enumerate(plan):
            if kind == "empty":
                ctx_ids = (a,)
                cont_ids = bos + tuple(encoded[b])
            else:
                if a not in shared:
                    shared[a] = bos + tuple(encoded[a])
                ctx_ids = shared[a]
                cont_ids = tuple(encoded[b][len(ctx_ids) - len(bos) :])
            choices.append(Choice(ctx_ids, cont_ids, conts[k], norm[k]))
        requests.append(
            Request(
                task=task.name,
                doc_id=n if task.subjects else i,  # a running index over a task made of subjects
                subject=subject,
                choices=tuple(choices),
                gold=_gold(task, doc),
                context_text=contexts[0],
                fewshot_ids=tuple(shot_ids),
            )
        )
    return requests
