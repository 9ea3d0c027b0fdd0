"""The fast evaluator (fused attention, prefix reuse) equals the model's own attention on
SmolLM2 MMLU: the same answers and per-sequence flags, log-likelihoods within float rounding."""

import pytest
import torch

import inactive_heads as ih

# On either line: the "eager" form is the model's own forward (TransformerLens's attention on a
# HookedTransformer, the bridge's on a TransformerBridge); the fused and exact forms and prefix reuse
# are the toolkit's.

SUBJECTS = ["world_religions", "management"]
STATIC = [(l, h) for l in range(1, 30, 4) for h in (2, 7)]


@pytest.fixture(scope="module")
def plan(smollm2):
    return ih.plan_evaluation(smollm2, "mmlu", subjects=SUBJECTS, limit=2, num_fewshot=2)


@pytest.fixture(scope="module")
def eager_plain(smollm2, plan):
    return ih.evaluate(smollm2, plan, attention="eager", progress=False)


def _close(a, b, tol=2e-4):
    assert a.correct == b.correct
    worst = max(abs(x - y) for la, lb in zip(a.loglikelihoods, b.loglikelihoods) for x, y in zip(la, lb))
    assert worst <= tol, worst


def test_plain_fast_and_exact_equal_eager(smollm2, plan, eager_plain):
    _close(eager_plain, ih.evaluate(smollm2, plan, attention="fast", progress=False))
    exact = ih.evaluate(smollm2, plan, attention="exact", progress=False)
    _close(eager_plain, exact, tol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("score, tau", [("ahon_ln", 0.5), ("awft", 0.9)])
def test_dynamic_fast_equals_eager(smollm2, plan, score, tau):
    eager_abl, fast_abl = ih.DynamicAblation(score, tau), ih.DynamicAblation(score, tau)
    eager = ih.evaluate(smollm2, plan, ablation=eager_abl, attention="eager", progress=False)
    fast = ih.evaluate(smollm2, plan, ablation=fast_abl, attention="fast", progress=False)
    _close(eager, fast)
    assert 0 < fast.realized_fraction < 1
    # flags identical per (sequence, layer, head), not only in total
    assert (eager_abl.stats.flagged_mask() == fast_abl.stats.flagged_mask()).all()


@pytest.mark.parametrize("static", [False, True], ids=["plain", "static"])
def test_prefix_reuse_equals_full_recompute(smollm2, plan, eager_plain, static):
    make = (lambda: ih.StaticAblation(STATIC)) if static else (lambda: None)
    full = ih.evaluate(smollm2, plan, ablation=make(), attention="eager", progress=False) if static \
        else eager_plain
    reused = ih.evaluate(smollm2, plan, ablation=make(), reuse_prefix=True, progress=False)
    assert reused.prefix_reuse["groups"] == 2  # one shared few-shot prefix per subject
    assert reused.prefix_reuse["inputs_reused"] == len(plan.inputs)
    assert reused.prefix_reuse["branches"] == 0  # nothing decided per sequence: one path per prefix
    _close(full, reused)
    assert reused.realized_fraction == full.realized_fraction
    if static:
        assert full.loglikelihoods != eager_plain.loglikelihoods  # the zeroing did something


class _ScoreProbe(ih.DynamicAblation):
    """Dynamic ablation that also keeps each sequence's in-pass scores (to report a flag's distance to τ)."""

    def __init__(self, score, tau):
        super().__init__(score, tau)
        self.seen = {}

    def decide(self, acts):
        values = self.score(acts)
        for row, seq in enumerate(acts.sequence_ids.tolist()):
            self.seen[(seq, acts.layer)] = values[row].cpu()
        return super().decide(acts)


@pytest.mark.slow
@pytest.mark.parametrize("score, tau", [("ahon_ln", 0.6), ("awft", 0.9)])
def test_dynamic_prefix_reuse_equals_full_recompute(smollm2, score, tau):
    """Dynamic runs reusing each subject's few-shot prefix: identical answers and per-(sequence,
    layer, head) flags, log-likelihoods within float rounding, fewer prefix layers computed."""
    plan = ih.plan_evaluation(smollm2, "mmlu", subjects=SUBJECTS, limit=3, num_fewshot=2)
    full_abl, reuse_abl = _ScoreProbe(score, tau), _ScoreProbe(score, tau)
    full = ih.evaluate(smollm2, plan, ablation=full_abl, progress=False)
    reused = ih.evaluate(smollm2, plan, ablation=reuse_abl, reuse_prefix=True, batch_size=3, progress=False)
    a, b = full_abl.stats.flagged_mask(), reuse_abl.stats.flagged_mask()
    differing = [(s, l, h, float(full_abl.seen[(s, l)][h]) - tau, float(reuse_abl.seen[(s, l)][h]) - tau)
                 for s, l, h in (a != b).nonzero().tolist()]
    assert not differing, f"flags differ at (sequence, layer, head, score-τ full, score-τ reused): {differing}"
    _close(full, reused, tol=1e-4)
    assert 0 < reused.realized_fraction < 1
    info = reused.prefix_reuse
    assert info["used"] and info["groups"] == 2 and info["inputs_reused"] == len(plan.inputs)
    assert 0 < info["prefix_layers_computed"] < info["prefix_layers_needed"]


@pytest.mark.slow
def test_fast_form_is_one_arithmetic_for_recording_and_dynamic_runs(smollm2, plan):
    """With attention="fast" everywhere, record_scores, the recording pass and a dynamic run that
    zeroes nothing see the same numbers (to the bit), and those are within rounding of the exact form."""
    keys = ["ahon_ln", "awft"]
    recorded = ih.record_scores(smollm2, plan.inputs, keys, progress=False, attention="fast")
    in_pass = ih.evaluate(smollm2, plan, record=keys, attention="fast", progress=False)
    exact = ih.record_scores(smollm2, plan.inputs, keys, progress=False)
    for key in keys:
        assert torch.equal(recorded[key], in_pass.head_scores[key])
        torch.testing.assert_close(recorded[key], exact[key], rtol=1e-5, atol=1e-5)
    assert not torch.equal(recorded["ahon_ln"], exact["ahon_ln"])  # the forms differ: the check is not vacuous
    nothing = ih.evaluate(smollm2, plan, ablation=ih.DynamicAblation("ahon_ln", float(recorded["ahon_ln"].min())),
                          attention="fast", progress=False)
    assert nothing.realized_fraction == 0.0
    assert nothing.loglikelihoods == in_pass.loglikelihoods
