"""The fast evaluator (fused attention, prefix reuse) equals TransformerLens's eager attention on
SmolLM2 MMLU: the same answers and per-sequence flags, log-likelihoods within float rounding."""

import pytest

import inactive_heads as ih

SUBJECTS = ["world_religions", "management"]
STATIC = [(l, h) for l in range(1, 30, 4) for h in (2, 7)]


@pytest.fixture(scope="module")
def plan(smollm2_hooked):
    return ih.plan_evaluation(smollm2_hooked, "mmlu", subjects=SUBJECTS, limit=2, num_fewshot=2)


@pytest.fixture(scope="module")
def eager_plain(smollm2_hooked, plan):
    return ih.evaluate(smollm2_hooked, plan, attention="eager", progress=False)


def _close(a, b, tol=2e-4):
    assert a.correct == b.correct
    worst = max(abs(x - y) for la, lb in zip(a.loglikelihoods, b.loglikelihoods) for x, y in zip(la, lb))
    assert worst <= tol, worst


def test_plain_fast_and_exact_equal_eager(smollm2_hooked, plan, eager_plain):
    _close(eager_plain, ih.evaluate(smollm2_hooked, plan, attention="fast", progress=False))
    exact = ih.evaluate(smollm2_hooked, plan, progress=False)  # the default
    _close(eager_plain, exact, tol=1e-6)


@pytest.mark.parametrize("score, tau", [("ahon_ln", 0.5), ("awft", 0.9)])
def test_dynamic_fast_equals_eager(smollm2_hooked, plan, score, tau):
    eager_abl, fast_abl = ih.DynamicAblation(score, tau), ih.DynamicAblation(score, tau)
    eager = ih.evaluate(smollm2_hooked, plan, ablation=eager_abl, attention="eager", progress=False)
    fast = ih.evaluate(smollm2_hooked, plan, ablation=fast_abl, attention="fast", progress=False)
    _close(eager, fast)
    assert 0 < fast.realized_fraction < 1
    # flags identical per (sequence, layer, head), not only in total
    assert (eager_abl.stats.flagged_mask() == fast_abl.stats.flagged_mask()).all()


@pytest.mark.parametrize("static", [False, True], ids=["plain", "static"])
def test_prefix_reuse_equals_full_recompute(smollm2_hooked, plan, eager_plain, static):
    make = (lambda: ih.StaticAblation(STATIC)) if static else (lambda: None)
    full = ih.evaluate(smollm2_hooked, plan, ablation=make(), attention="eager", progress=False) if static \
        else eager_plain
    reused = ih.evaluate(smollm2_hooked, plan, ablation=make(), reuse_prefix=True, progress=False)
    assert reused.prefix_reuse["groups"] == 2  # one shared few-shot prefix per subject
    assert reused.prefix_reuse["inputs_reused"] == len(plan.inputs)
    _close(full, reused)
    assert reused.realized_fraction == full.realized_fraction
    if static:
        assert full.loglikelihoods != eager_plain.loglikelihoods  # the zeroing did something
