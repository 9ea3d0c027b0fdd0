"""The fast evaluator (fused attention, prefix reuse) equals TransformerLens's eager attention on
SmolLM2 MMLU: the same answers and realized fractions, log-likelihoods within float rounding."""

import pytest

import inactive_heads as ih

SUBJECTS = ["world_religions", "management"]


@pytest.fixture(scope="module")
def plan(smollm2_hooked):
    return ih.plan_evaluation(smollm2_hooked, "mmlu", subjects=SUBJECTS, limit=3, num_fewshot=2)


def _close(a, b, tol=2e-4):
    assert a.correct == b.correct
    worst = max(abs(x - y) for la, lb in zip(a.loglikelihoods, b.loglikelihoods) for x, y in zip(la, lb))
    assert worst <= tol, worst


@pytest.mark.parametrize("make", [
    lambda: None,
    lambda: ih.StaticAblation([(l, h) for l in range(0, 30, 3) for h in (0, 4)]),
    lambda: ih.DynamicAblation("ahon_ln", 0.5),
    lambda: ih.DynamicAblation("awft", 0.9),
], ids=["plain", "static", "ahon_ln", "awft"])
def test_fast_equals_eager_attention(smollm2_hooked, plan, make):
    eager_abl, fast_abl = make(), make()
    eager = ih.evaluate(smollm2_hooked, plan, ablation=eager_abl, attention="eager", progress=False)
    fast = ih.evaluate(smollm2_hooked, plan, ablation=fast_abl, progress=False)
    _close(eager, fast)
    if eager_abl is not None:
        # dynamic flags: identical per (sequence, layer, head), not only in total
        assert (eager_abl.stats.flagged_mask() == fast_abl.stats.flagged_mask()).all()
        assert fast.realized_fraction == eager.realized_fraction


@pytest.mark.parametrize("static", [False, True])
def test_prefix_reuse_equals_full_recompute(smollm2_hooked, plan, static):
    heads = [(l, h) for l in range(1, 30, 4) for h in (2, 7)]
    ablation = (lambda: ih.StaticAblation(heads)) if static else (lambda: None)
    full = ih.evaluate(smollm2_hooked, plan, ablation=ablation(), attention="eager", progress=False)
    reused = ih.evaluate(smollm2_hooked, plan, ablation=ablation(), reuse_prefix=True, progress=False)
    assert reused.prefix_reuse["inputs_reused"] == len(plan.inputs)  # two subjects: every input reused
    assert reused.prefix_reuse["groups"] == 2
    _close(full, reused)
    assert reused.realized_fraction == full.realized_fraction
