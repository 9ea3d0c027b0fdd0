"""Registered ablation kinds: specs round-trip, and a registered custom kind runs everywhere.

Expected values come from elsewhere than the code under test: a model whose output weights
``W_O`` of the chosen heads are zeroed (no hook at all: a head's output ``o_t W_O^(h)`` is then
exactly gone), hand counts of zeroed (sequence, layer, head) triples, the spec dicts that sweeps
wrote to ``tests/fixtures/sweep_format_1`` (the records' format), and the built-in
``StaticAblation`` of the same heads.
"""

import json
from pathlib import Path

import pytest
import torch
from tiny import random_sequences, tiny_gqa_model
from listed_heads import ZeroListedHeads
from tiny_predictor import fit_tiny_predictor

import inactive_heads as ih
from inactive_heads.evaluation.evaluator import EvalPlan, index_forward_inputs
from inactive_heads.evaluation.tasks import Choice, Request
from inactive_heads.models.tl_line import is_hooked_transformer

FIXTURE_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_format_1" / "runs"
HEADS = [(0, 1), (1, 4), (2, 0), (2, 5)]
TAU = 0.98  # ahon_ln on the tiny model: flags some heads of every layer, not all


class ZeroFixed(ZeroListedHeads):
    """A fixed set of heads, written without StaticAblation: the mask is built in decide."""


class KeepLayer0(ih.DynamicAblation):  # registered: its spec is the parent's arguments, nothing to write
    def decide(self, acts):
        return super().decide(acts) & (acts.layer != 0)


class TwoQuietest(ih.HeadAblation):  # registered with no arguments
    def decide(self, acts):
        norms = acts.mean_over_positions(acts.z.norm(dim=-1))
        quiet = norms.topk(2, dim=-1, largest=False).indices
        return torch.zeros_like(norms, dtype=torch.bool).scatter(1, quiet, True)


@pytest.fixture(scope="module", autouse=True)
def registered():
    kinds = {"zero_fixed": ZeroFixed, "keep_layer0": KeepLayer0, "two_quietest": TwoQuietest}
    for kind, cls in kinds.items():
        ih.register_ablation(kind)(cls)
    yield kinds
    for kind in kinds:
        ih.unregister_ablation(kind)


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model(seed=2)


def examples(predictor_dir):
    """One instance of every registered kind (built-in, the toolkit's ``predicted``, the three above)."""
    return {
        "predicted": ih.PredictedAblation(predictor_dir),
        "static": ih.StaticAblation(HEADS),
        "dynamic": ih.DynamicAblation("ahon_ln", TAU, seed=1),
        "random": ih.RandomAblation(0.3, seed=4),
        "zero_fixed": ZeroFixed(HEADS),
        "keep_layer0": KeepLayer0("ahon_ln", TAU),
        "two_quietest": TwoQuietest(),
    }


def run_with(model, ablation, tokens):
    with ablation.apply(model), torch.inference_mode():
        logits = model(tokens)
    return logits, ablation.stats.flagged_mask()


def tiny_plan(sequences, seed=0) -> EvalPlan:
    """A 3-choice, one-token-answer task over ``sequences``."""
    gen = torch.Generator().manual_seed(seed)
    requests = []
    for i, seq in enumerate(sequences):
        answers = torch.randint(0, 97, (3,), generator=gen).tolist()
        requests.append(Request("mmlu", i, "tiny", tuple(Choice(tuple(seq), (a,), f" {a}") for a in answers), 0, ""))
    inputs, targets, cut = index_forward_inputs("mmlu", requests, 64)
    return EvalPlan("mmlu", requests, inputs, targets, {"task": "mmlu"}, n_truncated=cut)


def without_heads(seed, heads):
    """The tiny model with the output weights W_O of ``heads`` set to zero (no hook involved)."""
    model = tiny_gqa_model(seed=seed)
    with torch.no_grad():
        for layer, head in heads:
            if is_hooked_transformer(model):
                model.blocks[layer].attn.W_O[head] = 0.0
            else:
                d_head = model.cfg.d_head
                o_proj = model.original_model.model.layers[layer].self_attn.o_proj
                o_proj.weight[:, head * d_head:(head + 1) * d_head] = 0.0
    return model


def test_every_registered_kind_round_trips_through_its_json_spec(tiny, tmp_path):
    fit_tiny_predictor(tiny, tmp_path)
    instances = examples(tmp_path)
    assert set(ih.ablation_kinds()) == set(instances)  # a new kind must be added here
    tokens = torch.tensor(random_sequences(4, seed=3, min_len=12, max_len=12))
    plain = tiny(tokens)
    for kind, ablation in instances.items():
        spec = ablation.to_spec()
        stored = json.loads(json.dumps(spec))  # what a record holds
        assert stored["kind"] == kind
        rebuilt = ih.ablation_from_spec(stored)
        assert type(rebuilt) is type(ablation) and rebuilt.to_spec() == spec
        assert rebuilt.describe() == ablation.describe() == spec
        logits, flags = run_with(tiny, ablation, tokens)
        logits_again, flags_again = run_with(tiny, rebuilt, tokens)
        assert flags.any() and not torch.equal(logits, plain), kind  # it zeroes something
        assert torch.equal(flags, flags_again) and torch.equal(logits, logits_again), kind


def test_a_spec_differing_in_one_argument_rebuilds_a_different_ablation(tiny):
    tokens = torch.tensor(random_sequences(2, seed=3, min_len=12, max_len=12))
    spec = ZeroFixed(HEADS).to_spec()
    other = ih.ablation_from_spec({**spec, "heads": HEADS[:2]})
    assert not torch.equal(run_with(tiny, ZeroFixed(HEADS), tokens)[1], run_with(tiny, other, tokens)[1])


def test_records_written_by_sweeps_still_load_and_are_rewritten_identically():
    specs = [json.loads(p.read_text())["ablation"] for p in sorted(FIXTURE_RUNS.glob("*.json"))]
    specs = [s for s in specs if s is not None]
    assert {s["kind"] for s in specs} == {"dynamic", "random"}
    for spec in specs:
        rebuilt = ih.ablation_from_spec(spec)
        assert rebuilt.describe() == rebuilt.to_spec() == spec
        assert list(rebuilt.to_spec()) == ["kind", "score", "threshold", "heads", "seed"]  # key order too
    static = {"kind": "static", "score": None, "threshold": None, "heads": [[1, 2], [3, 0]], "seed": 0}
    assert ih.StaticAblation([(3, 0), (1, 2)]).describe() == static == ih.ablation_from_spec(static).to_spec()


def test_a_registered_custom_kind_runs_in_evaluate_and_is_recorded_by_its_spec(tiny):
    plan = tiny_plan(random_sequences(6, seed=11, min_len=8, max_len=16))
    custom = ih.evaluate(tiny, plan, ablation=ZeroFixed(HEADS), progress=False)
    expected = ih.evaluate(without_heads(2, HEADS), plan, attention="exact", progress=False)
    plain = ih.evaluate(tiny, plan, attention="exact", progress=False)
    assert max(abs(a - b) for q, r in zip(custom.loglikelihoods, expected.loglikelihoods) for a, b in zip(q, r)) < 1e-5
    assert max(abs(a - b) for q, r in zip(custom.loglikelihoods, plain.loglikelihoods) for a, b in zip(q, r)) > 1e-3
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    assert custom.realized_fraction == len(HEADS) / (n_layers * n_heads)  # every sequence, by hand
    assert custom.config["ablation"] == {"kind": "zero_fixed", "heads": [list(h) for h in HEADS]}
    # the record rebuilds it, as does its JSON text: the same log-likelihoods
    for again in (custom.config["ablation"], json.dumps(custom.config["ablation"])):
        assert ih.evaluate(tiny, plan, ablation=again, progress=False).loglikelihoods == custom.loglikelihoods
    static = ih.evaluate(tiny, plan, ablation=ih.StaticAblation(HEADS), progress=False)
    assert static.loglikelihoods == custom.loglikelihoods
    named = ih.evaluate(tiny, plan, ablation="two_quietest", progress=False)  # a kind's name as text
    assert named.realized_fraction == 2 / n_heads and named.config["ablation"] == {"kind": "two_quietest"}


@pytest.mark.parametrize("decision", ["per_step", "prompt"])
def test_a_registered_custom_kind_runs_in_generation(tiny, decision):
    prompts = random_sequences(3, seed=7, min_len=5, max_len=9)
    custom = ih.generate(tiny, prompts, ablation={"kind": "zero_fixed", "heads": HEADS}, decision=decision,
                         max_new_tokens=4, progress=False)
    by_weights = ih.generate(without_heads(2, HEADS), prompts, decision=decision, max_new_tokens=4, progress=False)
    assert custom.tokens == by_weights.tokens
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    assert custom.realized_fraction == pytest.approx(len(HEADS) / (n_layers * n_heads), abs=1e-12)


def test_an_unknown_kind_is_a_one_line_error_listing_the_registered_kinds(tiny):
    listed = "registered: static, dynamic, random, predicted, zero_fixed, keep_layer0, two_quietest ("
    for call in (lambda: ih.ablation_from_spec({"kind": "zap"}), lambda: ih.AblationSpec("zap"),
                 lambda: ih.evaluate(tiny, tiny_plan([[3, 4, 5]]), ablation="zap", progress=False)):
        with pytest.raises(ih.UserError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"unknown ablation kind 'zap'; {listed}") and "\n" not in message
    with pytest.raises(ih.UserError, match=r"^ablation kind 'custom' is the record of an unregistered"):
        ih.ablation_from_spec({"kind": "custom", "name": "X", "class": "m.X", "base": None})


def test_an_unregistered_subclass_still_runs_but_has_no_spec(tiny):
    class Unregistered(ZeroFixed):
        def decide(self, acts):
            return super().decide(acts)

    plan = tiny_plan(random_sequences(2, seed=1, min_len=6, max_len=8))
    run = ih.evaluate(tiny, plan, ablation=Unregistered(HEADS), progress=False)
    assert run.config["ablation"]["kind"] == "custom"
    assert run.config["ablation"]["base"] == {"kind": "zero_fixed", "heads": [list(h) for h in HEADS]}
    with pytest.raises(ih.UserError) as info:
        Unregistered(HEADS).to_spec()
    assert str(info.value) == (
        "Unregistered is not a registered ablation kind, so it has no spec to rebuild it from; decorate the class "
        "with @ih.register_ablation('name') (and import its module where the spec is read)"
    )


@pytest.mark.parametrize("register, message", [
    (lambda: ih.register_ablation("zero_fixed")(TwoQuietest),
     r"^ablation kind 'zero_fixed' is already registered \(.*ZeroFixed\); pass overwrite=True to replace it$"),
    (lambda: ih.register_ablation("static", overwrite=True)(TwoQuietest),
     r"^'static' is a built-in ablation kind and cannot be replaced; choose another name$"),
    (lambda: ih.register_ablation("my kind"), r"^ablation kind 'my kind' must be a Python identifier"),
    (lambda: ih.register_ablation("custom"), r"^ablation kind 'custom' is reserved"),
    (lambda: ih.register_ablation("plain")(object), r"^register_ablation\('plain'\) decorates a HeadAblation"),
    (lambda: ih.register_ablation("again")(ZeroFixed), r"^ZeroFixed is already registered as ablation kind"),
    (lambda: ih.unregister_ablation("dynamic"), r"^'dynamic' is a built-in ablation kind and cannot be removed$"),
    (lambda: ih.ablation_from_spec({"kind": "zero_fixed", "layers": [1]}),
     r"^cannot build ablation kind 'zero_fixed' \(ZeroFixed\) from params \{'layers': \[1\]\}: "),
    (lambda: ih.AblationSpec("zero_fixed", params={"heads": {1, 2}}),
     r"^the params of ablation kind 'zero_fixed' must be JSON values"),
])
def test_registration_mistakes_are_one_line_errors(register, message):
    with pytest.raises(ih.UserError, match=message) as info:
        register()
    assert "\n" not in str(info.value)
    assert ih.ablation_kinds() == ["static", "dynamic", "random", "predicted", "zero_fixed", "keep_layer0",
                                   "two_quietest"]
