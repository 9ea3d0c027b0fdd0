"""Custom ablations on SmolLM2-135M: through ``ih.evaluate`` and ``ih.lm_eval_model`` (issue 17).

Expected values are hand counts (two heads of nine per layer and sequence) and the parent's own
run (which must zero part of layer 0 for the override's "nothing in layer 0" to mean anything).
"""

import pytest
import torch

import inactive_heads as ih
from listed_heads import ZeroListedHeads

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance


class KeepLayer0(ih.DynamicAblation):
    def decide(self, acts):
        return super().decide(acts) & (acts.layer != 0)


class TwoQuietest(ih.HeadAblation):  # the "5 lines": a subclass implementing only decide
    def decide(self, acts):
        norms = acts.mean_over_positions(acts.z.norm(dim=-1))
        quiet = norms.topk(2, dim=-1, largest=False).indices
        return torch.zeros_like(norms, dtype=torch.bool).scatter(1, quiet, True)


@pytest.fixture(scope="module")
def piqa(smollm2):
    return ih.plan_evaluation(smollm2, "piqa", limit=4)


@pytest.mark.slow
def test_custom_and_overridden_ablations_run_through_evaluate(smollm2, piqa):
    run = ih.evaluate(smollm2, piqa, ablation=TwoQuietest(), progress=False)
    assert run.realized_fraction == 2 / 9 and run.realized_fraction_per_layer == [2 / 9] * 30
    assert run.config["ablation"]["kind"] == "custom" and run.config["ablation"]["name"] == "TwoQuietest"
    scores = ih.record_scores(smollm2, piqa.inputs, ["ahon_ln"], progress=False)
    tau = ih.calibrate(scores, "ahon_ln", [0.3]).at(0.3)
    parent = ih.evaluate(smollm2, piqa, ablation=ih.DynamicAblation("ahon_ln", tau), progress=False)
    kept = ih.evaluate(smollm2, piqa, ablation=KeepLayer0("ahon_ln", tau), progress=False)
    assert parent.realized_fraction_per_layer[0] > 0  # the parent's rule zeroes some of layer 0 ...
    assert kept.realized_fraction_per_layer[0] == 0.0  # ... the override none
    assert kept.realized_fraction > 0
    assert kept.config["ablation"]["name"].startswith("KeepLayer0(ahon_ln:")


@pytest.mark.parametrize("decision", ["per_step", "prompt"])
def test_a_custom_ablation_runs_through_gsm8k(smollm2, decision):
    # The record describes the custom class (a custom ablation has no built-in spec to write).
    run = ih.evaluate(smollm2, "gsm8k", limit=1, max_gen_toks=3, decision=decision, ablation=TwoQuietest(),
                      progress=False)
    assert run.n == 1 and run.n_generated_tokens == 3
    assert run.realized_fraction == 2 / 9
    assert run.config["ablation"]["kind"] == "custom" and run.config["ablation"]["name"] == "TwoQuietest"


@pytest.mark.slow
def test_lm_eval_model_keeps_the_instance(smollm2, piqa):
    quiet = TwoQuietest()
    lm = ih.lm_eval_model(smollm2, ablation=quiet, batch_size=4, progress=False)
    assert lm.ablation is quiet
    requests = [Instance("loglikelihood", {}, ("The capital of France is", " Paris"), 0),
                Instance("loglikelihood", {}, ("Two plus two equals", " four"), 1)]
    out = lm.loglikelihood(requests)
    assert len(out) == 2 and all(lp < 0 for lp, _ in out)
    entry = lm.stats["loglikelihood"]
    assert entry["ablation"]["name"] == "TwoQuietest" and entry["ablation"]["kind"] == "custom"
    assert entry["realized_fraction"] == 2 / 9 and entry["flagged"] == 2 * 30 * 2
    assert lm.get_model_info()["inactive_heads"]["ablation"]["class"].endswith(".TwoQuietest")
    kept = ih.lm_eval_model(smollm2, ablation=KeepLayer0("ahon_ln", 0.9), batch_size=4, progress=False)
    kept.loglikelihood(requests)
    assert kept.stats["loglikelihood"]["realized_fraction_per_layer"][0] == 0.0


class ZeroFixed(ZeroListedHeads):
    """A fixed head set, the mask built in decide (registered below, so it has a spec)."""


HEADS = [(0, 3), (5, 1), (17, 8), (29, 0)]


@pytest.fixture
def zero_fixed():
    ih.register_ablation("zero_fixed_smollm2")(ZeroFixed)
    yield {"kind": "zero_fixed_smollm2", "heads": [list(h) for h in HEADS]}
    ih.unregister_ablation("zero_fixed_smollm2")


@pytest.mark.parametrize("decision", ["per_step", "prompt"])
def test_a_registered_kind_runs_through_gsm8k_and_is_recorded_by_its_spec(smollm2, zero_fixed, decision):
    # Expected: the built-in StaticAblation of the same heads; 4 of 270 heads on every forward pass.
    options = dict(limit=1, max_gen_toks=3, decision=decision, progress=False)
    run = ih.evaluate(smollm2, "gsm8k", ablation=zero_fixed, **options)
    static = ih.evaluate(smollm2, "gsm8k", ablation=ih.StaticAblation(HEADS), **options)
    assert run.generations == static.generations and run.n_generated_tokens == 3
    assert run.realized_fraction == pytest.approx(4 / 270, abs=1e-12)
    assert run.config["ablation"] == zero_fixed


@pytest.mark.slow
def test_a_registered_kind_runs_through_a_multiple_choice_task(smollm2, piqa, zero_fixed):
    run = ih.evaluate(smollm2, piqa, ablation=zero_fixed, progress=False)
    static = ih.evaluate(smollm2, piqa, ablation=ih.StaticAblation(HEADS), progress=False)
    plain = ih.evaluate(smollm2, piqa, attention="exact", progress=False)
    assert run.loglikelihoods == static.loglikelihoods != plain.loglikelihoods
    assert run.config["ablation"] == zero_fixed and run.realized_fraction == 4 / 270
