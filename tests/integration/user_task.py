"""A multiple-choice task defined and registered in user code, for the tests of ``ih.register_task``:
a sweep (and each Ray worker) knows the task only if it imports this module (``imports``)."""

import inactive_heads as ih

NAME = "user_capitals"

# Two splits, inline: the evaluated questions and the examples the few-shot prompt is drawn from.
DOCS = {
    "test": [
        {"country": "France", "options": ["Paris", "Rome", "Madrid"], "answer": 0},
        {"country": "Italy", "options": ["Berlin", "Rome", "Lisbon"], "answer": 1},
        {"country": "Spain", "options": ["Vienna", "Oslo", "Madrid"], "answer": 2},
        {"country": "Germany", "options": ["Berlin", "Athens", "Dublin"], "answer": 0},
        {"country": "Portugal", "options": ["Warsaw", "Lisbon", "Prague"], "answer": 1},
        {"country": "Norway", "options": ["Helsinki", "Copenhagen", "Oslo"], "answer": 2},
        {"country": "Austria", "options": ["Vienna", "Budapest", "Bern"], "answer": 0},
        {"country": "Greece", "options": ["Sofia", "Athens", "Ankara"], "answer": 1},
    ],
    "train": [
        {"country": "Japan", "options": ["Seoul", "Tokyo", "Beijing"], "answer": 1},
        {"country": "Canada", "options": ["Ottawa", "Toronto", "Quebec"], "answer": 0},
    ],
}


def question(doc: dict) -> str:
    return f"Q: What is the capital of {doc['country']}?\nA:"


def options(doc: dict) -> list[str]:
    return list(doc["options"])


def answer(doc: dict) -> int:
    return int(doc["answer"])


TASK = ih.register_task(ih.Task(
    NAME, docs=DOCS, doc_to_text=question, doc_to_choice=options, doc_to_target=answer,
    eval_split="test", fewshot_split="train", fewshot_sampler="first_n", num_fewshot=1,
    description="Capitals of countries.\n\n", metrics=("acc", "acc_norm"),
))
