"""Custom ablations are first-class: ``decide`` is the one extension point (tiny GQA model).

The expected values come from other code paths than the one under test: zeroing counted by a
separate ``hook_z`` probe installed after the ablation's hook, per-layer decisions rebuilt from
``record_scores`` under a ``StaticAblation`` of the earlier layers (as the cascade test does), and
hand counts (two heads per layer and sequence).
"""

import re
from pathlib import Path

import pytest
import torch
from tiny import random_sequences, tiny_gqa_model, value_weights

import inactive_heads as ih
from inactive_heads.evaluation.evaluator import EvalPlan, index_forward_inputs
from inactive_heads.evaluation.tasks import Choice, Request
from inactive_heads.runtime.hooks import make_batches, run_forward

DOCS = Path(__file__).resolve().parents[2] / "docs"
TAU = 0.98  # ahon_ln on the tiny model (about 0.85-1.3): flags some heads of every layer, not all


class KeepLayer0(ih.DynamicAblation):
    def decide(self, acts):
        return super().decide(acts) & (acts.layer != 0)


class TwoQuietest(ih.HeadAblation):  # the 5-line custom ablation: only decide
    def decide(self, acts):
        norms = acts.mean_over_positions(acts.z.norm(dim=-1))  # [batch, head]
        quiet = norms.topk(2, dim=-1, largest=False).indices
        return torch.zeros_like(norms, dtype=torch.bool).scatter(1, quiet, True)


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model(seed=2)


@pytest.fixture(scope="module")
def sequences():
    return random_sequences(6, seed=11, min_len=8, max_len=16)


def tiny_plan(sequences, seed=0) -> EvalPlan:
    """A 3-choice, one-token-answer task over ``sequences`` (one forward input per question)."""
    gen = torch.Generator().manual_seed(seed)
    requests = []
    for i, seq in enumerate(sequences):
        answers = torch.randint(0, 97, (3,), generator=gen).tolist()
        choices = tuple(Choice(tuple(seq), (a,), f" {a}") for a in answers)
        requests.append(Request("mmlu", i, "tiny", choices, 0, ""))
    inputs, targets, cut = index_forward_inputs("mmlu", requests, 64)
    return EvalPlan("mmlu", requests, inputs, targets, {"task": "mmlu"}, n_truncated=cut)


def zeroed_by_probe(model, sequences, ablation) -> torch.Tensor:
    """[sequence, layer, head]: heads whose z reaching W_O is all zero at the real positions, seen
    by a hook_z probe that runs after the ablation's hook (an independent count)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    out = torch.zeros((len(sequences), n_layers, n_heads), dtype=torch.bool)
    current = {}

    def probe(layer):
        def hook(z, hook):
            valid = current["valid"]
            for row, seq in enumerate(current["ids"]):
                out[seq, layer] = (z[row][valid[row]] == 0).all(dim=0).all(dim=-1)
        return hook

    runner = ablation.runner(model)
    hooks = runner.fwd_hooks() + [(f"blocks.{l}.attn.hook_z", probe(l)) for l in range(n_layers)]
    with model.hooks(fwd_hooks=hooks):
        for batch in make_batches(sequences, 4):
            runner.set_batch(batch.valid, batch.indices)
            current.update(valid=batch.valid, ids=batch.indices.tolist())
            run_forward(model, batch.tokens, batch.valid)
    return out


def rebuilt_decisions(model, sequences, mask, tau) -> torch.Tensor:
    """ahon_ln < τ at each layer, recorded (no ablation code deciding) with the heads ``mask``
    flags in the earlier layers zeroed: what the parent's rule decides at every layer."""
    n_layers = model.cfg.n_layers
    out = torch.zeros_like(mask)
    for s, seq in enumerate(sequences):
        for layer in range(n_layers):
            earlier = [(l, h) for l in range(layer) for h in mask[s, l].nonzero().flatten().tolist()]
            with ih.StaticAblation(earlier).apply(model):
                scores = ih.record_scores(model, [seq], ["ahon_ln"], progress=False)["ahon_ln"]
            out[s, layer] = scores[0, layer] < tau
    return out


def test_an_override_of_dynamic_decide_is_what_runs(tiny, sequences):
    plain = ih.record_scores(tiny, sequences, ["ahon_ln"], progress=False)["ahon_ln"]
    assert (plain[:, 0] < TAU).any(), "the parent's rule must want to zero some of layer 0 here"
    keep = KeepLayer0("ahon_ln", TAU)
    zeroed = zeroed_by_probe(tiny, sequences, keep)
    mask = keep.stats.flagged_mask()
    assert not zeroed[:, 0].any()  # layer 0 is never zeroed (the old in-pass path ignored the override)
    assert zeroed[:, 1:].any()
    assert torch.equal(zeroed, mask)  # the counts are what was zeroed
    expected = rebuilt_decisions(tiny, sequences, mask, TAU)
    expected[:, 0] = False
    assert torch.equal(mask, expected)  # the other layers decide by the parent's rule, cascade included


def test_the_override_runs_in_evaluate_and_prefix_reuse_and_is_named_after_its_class(tiny, sequences):
    plan = tiny_plan(sequences)
    keep = KeepLayer0("ahon_ln", TAU)
    run = ih.evaluate(tiny, plan, ablation=keep, progress=False)
    assert run.realized_fraction_per_layer[0] == 0.0 and run.realized_fraction > 0
    assert run.config["ablation"] == {"kind": "custom", "name": "KeepLayer0(ahon_ln:0.98)",
                                      "class": f"{__name__}.KeepLayer0",
                                      "base": ih.AblationSpec("dynamic", score="ahon_ln", threshold=TAU).to_dict()}
    assert keep.spec is None and keep.name == "KeepLayer0(ahon_ln:0.98)"
    probe = zeroed_by_probe(tiny, plan.inputs, KeepLayer0("ahon_ln", TAU))
    assert torch.equal(keep.stats.flagged_mask(), probe)  # evaluate zeroed what a direct run zeroes
    parent = ih.evaluate(tiny, plan, ablation=ih.DynamicAblation("ahon_ln", TAU), progress=False)
    assert parent.realized_fraction_per_layer[0] > 0
    assert parent.config["ablation"]["kind"] == "dynamic"


def test_a_subclass_implementing_only_decide_runs_through_evaluate(tiny, sequences):
    plan = tiny_plan(sequences)
    quiet = TwoQuietest()
    run = ih.evaluate(tiny, plan, ablation=quiet, progress=False)
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    assert run.realized_fraction == 2 / n_heads  # two heads of every layer of every sequence
    assert run.realized_fraction_per_layer == [2 / n_heads] * n_layers
    assert run.config["ablation"] == {"kind": "custom", "name": "TwoQuietest", "class": f"{__name__}.TwoQuietest",
                                      "base": None}
    plain = ih.evaluate(tiny, plan, progress=False)
    assert run.loglikelihoods != plain.loglikelihoods
    # the same heads by hand: mean z norm over the real positions, unablated layer 0
    cache = {}
    with torch.inference_mode(), tiny.hooks(fwd_hooks=[("blocks.0.attn.hook_z",
                                                        lambda z, hook: cache.__setitem__("z", z.clone()))]):
        tiny(torch.tensor([plan.inputs[0]]))
    norms = cache["z"][0].norm(dim=-1).mean(dim=0)  # [head]
    by_hand = set(norms.argsort()[:2].tolist())
    assert set(quiet.stats.flagged_mask()[0, 0].nonzero().flatten().tolist()) == by_hand
    # a recording-style run: scores recorded with the custom ablation's heads zeroed (apply() treats
    # every position as real and numbers rows per pass: one unpadded batch)
    same_length = random_sequences(4, seed=12, min_len=10, max_len=10)
    recording = TwoQuietest()
    with recording.apply(tiny):
        scores = ih.record_scores(tiny, same_length, ["ahon"], batch_size=4, progress=False)["ahon"]
    assert recording.stats.realized_fraction == 2 / n_heads and recording.stats.n_sequences == 4
    unablated = ih.record_scores(tiny, same_length, ["ahon"], progress=False)["ahon"]  # not layer-normalized
    # layer 0: the zeroed heads read as silent (the recorder sees z after the zeroing), the others as before
    flagged = recording.stats.flagged_mask()[:, 0]
    assert (scores[:, 0][flagged] == 0).all() and torch.equal(scores[:, 0][~flagged], unablated[:, 0][~flagged])
    assert not torch.equal(scores[:, 1:], unablated[:, 1:])  # later layers see the zeroing's cascade


def test_the_override_adds_no_device_to_host_wait(tiny, sequences, monkeypatch):
    """Counting every host read (cpu, item, tolist, bool, float) over two batches: the override
    costs what the built-in costs (one copy per batch), and decide ran at every layer of both."""
    batches = list(make_batches(sequences, 3))

    def run(ablation):
        runner = ablation.runner(tiny)
        with tiny.hooks(fwd_hooks=runner.fwd_hooks()):
            for batch in batches:
                runner.set_batch(batch.valid, batch.indices)
                run_forward(tiny, batch.tokens, batch.valid)

    run(ih.DynamicAblation("ahon_ln", TAU))  # the first-use check of the exact form runs here, once
    counts = {}
    for name in ("cpu", "item", "tolist", "__bool__", "__float__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    calls = []

    class Spy(KeepLayer0):
        def decide(self, acts):
            calls.append(acts.layer)
            return super().decide(acts)

    run(ih.DynamicAblation("ahon_ln", TAU))
    built_in, counts = dict(counts), {}
    run(Spy("ahon_ln", TAU))
    assert counts == built_in and counts.get("cpu") == 1  # batch 1 flushed when batch 2 starts
    assert calls == list(range(tiny.cfg.n_layers)) * len(batches)


def test_a_non_finite_score_is_still_an_error_through_an_override(tiny):
    model = tiny_gqa_model(seed=5)
    with torch.no_grad():
        value_weights(model, 1)[0].fill_(float("nan"))
    abl = KeepLayer0("ahon", 0.5)
    with abl.apply(model), torch.inference_mode():
        model(torch.tensor(random_sequences(1, seed=5, min_len=6, max_len=6)))
    with pytest.raises(FloatingPointError, match="score 'ahon' is not finite at layer 1"):
        _ = abl.stats.realized_fraction


def test_decide_returning_the_wrong_thing_is_a_one_line_error(tiny, sequences):
    class Wrong(ih.HeadAblation):
        def decide(self, acts):
            return torch.zeros(acts.n_heads)  # float, and no batch dimension

    wrong = r"^Wrong.decide returned a torch.float32 tensor of shape \(6,\); return a bool tensor of shape \[batch, head\] = \[1, 6\]$"
    with pytest.raises(ih.UserError, match=wrong), Wrong().apply(tiny), torch.inference_mode():
        tiny(torch.tensor([sequences[0]]))
    bare = type("Bare", (ih.HeadAblation,), {})()
    with pytest.raises(NotImplementedError, match="Bare must implement decide"), bare.apply(tiny), torch.inference_mode():
        tiny(torch.tensor([sequences[0]]))


def test_built_in_names_and_specs_are_unchanged():
    for abl, name in ((ih.DynamicAblation("ahon_ln", 0.5), "ahon_ln:0.5"), (ih.RandomAblation(0.1), "random:0.1"),
                      (ih.StaticAblation([(1, 2)]), "static:1heads")):
        assert abl.name == name == abl.spec.name
        assert abl.describe() == abl.spec.to_dict()
        assert type(abl.spec.build()) is type(abl)


def test_the_docs_custom_ablation_example_runs(tiny, sequences):
    """docs/ablation.md's "Your own ablation" example, run on the tiny model (the docs test runs it on SmolLM2)."""
    text = (DOCS / "ablation.md").read_text(encoding="utf-8")
    section = text.split("## Your own ablation", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert blocks, "docs/ablation.md has no python example under '## Your own ablation'"
    namespace = {"ih": ih, "torch": torch, "model": tiny, "plan": tiny_plan(sequences)}
    for code in blocks:
        exec(compile(code, str(DOCS / "ablation.md"), "exec"), namespace)  # noqa: S102  (the docs' own code)
    kept, quiet = namespace["kept"], namespace["quiet"]
    assert kept.realized_fraction_per_layer[0] == 0.0
    assert quiet.realized_fraction == 2 / tiny.cfg.n_heads
    assert quiet.config["ablation"]["name"] == "QuietestHeads"
