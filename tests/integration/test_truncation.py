"""Prompts longer than the context are left-truncated as lm-eval 0.4.5 does, and counted.

lm-eval's rule, restated here independently of the evaluator: of context + continuation, drop
tokens from the left until at most ``n_ctx + 1`` remain, feed all but the last, and read the
continuation's log-probabilities at the input's last ``len(continuation)`` positions.
"""

import dataclasses
import types

import pytest
import torch

import inactive_heads as ih
from inactive_heads.evaluation.evaluator import evaluate, plan_evaluation

SUBJECTS = ["anatomy"]
LIMIT = 4
SHOTS = 0  # short prompts keep the test cheap; the rule does not depend on their length


def with_context(model, n_ctx: int):
    """The model's facts with a smaller context, for planning only (the weights are not needed)."""
    info = dataclasses.replace(ih.model_info(model), n_ctx=n_ctx)
    return types.SimpleNamespace(tokenizer=model.tokenizer, inactive_heads_info=info)


@pytest.mark.slow
def test_long_prompts_are_left_truncated_and_scored_like_lm_eval(smollm2):
    model = smollm2
    full = plan_evaluation(model, "mmlu", subjects=SUBJECTS, limit=LIMIT, num_fewshot=SHOTS)
    lengths = sorted(len(x) for x in full.inputs)
    assert full.n_truncated == 0
    n_ctx = lengths[len(lengths) // 2]  # some prompts fit, some do not
    plan = plan_evaluation(with_context(model, n_ctx), "mmlu", subjects=SUBJECTS, limit=LIMIT, num_fewshot=SHOTS)

    forward: dict[tuple[int, ...], torch.Tensor] = {}
    expected_truncated = 0
    expected_ll = []
    for req in plan.requests:
        lls, cut = [], False
        for choice in req.choices:
            ctx, cont = list(choice.context_ids), list(choice.continuation_ids)
            drop = max(0, len(ctx) + len(cont) - 1 - n_ctx)
            cut |= drop > 0
            ids = (ctx + cont)[drop : len(ctx) + len(cont) - 1]
            assert len(ids) <= n_ctx and ids[-1] == (ctx + cont)[-2]
            assert ids in plan.inputs
            if tuple(ids) not in forward:
                with torch.inference_mode():
                    forward[tuple(ids)] = model(torch.tensor([ids]))[0].log_softmax(-1)
            logprobs = forward[tuple(ids)]
            positions = range(len(ids) - len(cont), len(ids))
            lls.append(sum(logprobs[p, t].item() for p, t in zip(positions, cont)))
        expected_truncated += cut
        expected_ll.append(lls)
    assert 0 < expected_truncated < len(plan.requests)
    assert plan.n_truncated == expected_truncated
    assert max(len(x) for x in plan.inputs) == n_ctx

    result = evaluate(model, plan, batch_size=4, progress=False)
    assert result.n_truncated == expected_truncated
    for got, want in zip(result.loglikelihoods, expected_ll):
        assert got == pytest.approx(want, abs=2e-4)


def test_an_answer_longer_than_the_context_is_a_one_line_error(smollm2):
    with pytest.raises(ValueError, match=r"answer, longer than the model context 0; load the model with a larger n_ctx"):
        plan_evaluation(with_context(smollm2, 0), "mmlu", subjects=SUBJECTS, limit=1)
