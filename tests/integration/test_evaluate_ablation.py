"""Evaluation with ablation on real SmolLM2: exactness, backends agree, and one-line errors."""

import dataclasses

import pytest
import torch

import inactive_heads as ih

SUBJECTS = ["world_religions", "management"]


@pytest.fixture(scope="module")
def plan(smollm2):
    return ih.plan_evaluation(smollm2, "mmlu", subjects=SUBJECTS, limit=4, num_fewshot=1)


@pytest.fixture(scope="module")
def plain(smollm2, plan):
    return ih.evaluate(smollm2, plan, progress=False)


@pytest.mark.slow
def test_dynamic_ablation_that_flags_nothing_reproduces_the_plain_run(smollm2, plan, plain):
    """Bit for bit against the plain run in the same (exact) arithmetic; the default plain run uses
    the fused kernel, so it agrees to float rounding."""
    exact = ih.evaluate(smollm2, plan, attention="exact", progress=False)
    for ablation in (ih.DynamicAblation("ahon_ln", -1.0), ih.DynamicAblation("awft", 2.0), ih.RandomAblation(0.0)):
        res = ih.evaluate(smollm2, plan, ablation=ablation, progress=False)
        assert res.loglikelihoods == exact.loglikelihoods
        assert res.realized_fraction == 0.0
    worst = max(abs(x - y) for a, b in zip(plain.loglikelihoods, exact.loglikelihoods) for x, y in zip(a, b))
    assert worst <= 1e-4 and plain.correct == exact.correct


def test_dynamic_ablation_zeroes_and_reports_the_realized_fraction(smollm2, plan, plain):
    res = ih.evaluate(smollm2, plan, ablation=ih.DynamicAblation("ahon_ln", 0.5), progress=False)
    assert 0 < res.realized_fraction < 1
    per_layer = torch.tensor(res.realized_fraction_per_layer)
    assert per_layer.shape == (30,)
    assert per_layer.mean().item() == pytest.approx(res.realized_fraction)
    assert res.loglikelihoods != plain.loglikelihoods
    assert res.config["ablation"] == {"kind": "dynamic", "score": "ahon_ln", "threshold": 0.5, "heads": [], "seed": 0}


def test_static_ablation_agrees_across_backends(smollm2_hooked, smollm2_bridge, plan):
    heads = [(l, h) for l in range(0, 30, 3) for h in (0, 4, 8)]
    hooked = ih.evaluate(smollm2_hooked, plan, ablation=ih.StaticAblation(heads), progress=False)
    bridge_plan = ih.plan_evaluation(smollm2_bridge, "mmlu", subjects=SUBJECTS, limit=4, num_fewshot=1)
    assert bridge_plan.inputs == plan.inputs
    bridge = ih.evaluate(smollm2_bridge, bridge_plan, ablation=ih.StaticAblation(heads), progress=False)
    torch.testing.assert_close(torch.tensor(bridge.loglikelihoods), torch.tensor(hooked.loglikelihoods),
                               rtol=1e-4, atol=1e-4)
    assert hooked.realized_fraction == bridge.realized_fraction == pytest.approx(len(heads) / 270)


def test_zeroing_every_head_leaves_no_attention_output_on_the_real_model(smollm2_hooked, smollm2_bridge):
    tokens = torch.tensor([smollm2_hooked.tokenizer("Paris is the capital of", add_special_tokens=False)["input_ids"]])
    every = ih.StaticAblation([(l, h) for l in range(30) for h in range(9)])
    for model in (smollm2_hooked, smollm2_bridge):
        with every.apply(model):
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_out") or n.endswith("hook_attn_out"))
        assert len(cache) >= 30
        for value in cache.values():  # SmolLM2's o_proj has no bias: exactly zero
            assert torch.count_nonzero(value) == 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(task="mmlu2"), ValueError, "unknown task 'mmlu2'; known: mmlu, piqa, winogrande"),
        (dict(task="mmlu", subjects=["anatomyy"]), ValueError, "unknown MMLU subject 'anatomyy'"),
        (dict(task="mmlu", subjects=["anatomy"], limit=0), ValueError, "limit"),
        (dict(task="mmlu", subjects=["anatomy"], limit=-3), ValueError, "limit"),
        (dict(task="piqa", ablation="ahon_ln"), ValueError, "unknown ablation kind 'ahon_ln'; registered: static, "),
        (dict(task="piqa", ablation=3), ValueError, "ablation must be None, a HeadAblation"),
    ],
)
def test_bad_input_gives_one_line(smollm2, kwargs, error, message):
    task = kwargs.pop("task")
    with pytest.raises(error, match=message) as exc:
        ih.evaluate(smollm2, task, progress=False, **kwargs)
    assert "\n" not in str(exc.value)


def test_prompt_longer_than_the_context_is_truncated_not_refused(smollm2, monkeypatch):
    # lm-eval 0.4.5 left-truncates; the exact ids and scores are checked in test_truncation.py.
    short = dataclasses.replace(ih.model_info(smollm2), n_ctx=100)
    monkeypatch.setattr(smollm2, "inactive_heads_info", short)
    result = ih.evaluate(smollm2, "mmlu", subjects=["anatomy"], limit=1, progress=False)
    assert (result.n, result.n_truncated) == (1, 1)
