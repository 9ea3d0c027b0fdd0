"""A predictor fit on a tiny model's own in-pass oracle (for tests of PredictedAblation)."""

import torch
from tiny import random_sequences

from inactive_heads.evaluation.evaluator import EvalPlan, index_forward_inputs
from inactive_heads.evaluation.tasks import Choice, Request
from inactive_heads.prediction.oracle import collect_oracle, fit_from_oracle
from inactive_heads.prediction.probe import FitOptions

TAU = 0.98  # ahon_ln on the tiny models: flags some heads of every layer, not all


def tiny_plan(sequences, seed=0, subject="tiny", texts=None) -> EvalPlan:
    """A 3-choice, one-token-answer task over ``sequences`` (one forward input per question) of one
    ``subject`` (or a list: each question's); ``texts``: the questions' prompt texts, their identity
    (default q0, q1, ...)."""
    gen = torch.Generator().manual_seed(seed)
    texts = [f"q{i}" for i in range(len(sequences))] if texts is None else texts
    subjects = [subject] * len(sequences) if isinstance(subject, str) else subject
    requests = []
    for i, (seq, text, subject) in enumerate(zip(sequences, texts, subjects, strict=True)):
        answers = torch.randint(0, 97, (3,), generator=gen).tolist()
        requests.append(Request("mmlu", i, subject, tuple(Choice(tuple(seq), (a,), f" {a}") for a in answers), 0,
                                text))
    inputs, targets, cut = index_forward_inputs("mmlu", requests, 64)
    return EvalPlan("mmlu", requests, inputs, targets, {"task": "mmlu"}, n_truncated=cut)


def fit_tiny_predictor(model, directory, *, lookahead=0, n=24, seed=5, steps=60):
    """Fit on ``n`` random sequences of the tiny model and save to ``directory``; returns the predictor."""
    plan = tiny_plan(random_sequences(n, seed=seed, min_len=6, max_len=20))
    data = collect_oracle(model, plan, "ahon_ln", TAU, batch_size=8)
    predictor = fit_from_oracle(data, model="tiny", score="ahon_ln", threshold=TAU, lookahead=lookahead,
                                options=FitOptions(rank=4, steps=steps), task="mmlu", p=None)
    predictor.save(directory)
    return predictor
