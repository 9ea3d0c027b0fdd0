"""The ablations and their specs fed wrong input (fuzz_harness.py says the contract)."""

from typing import Any

import pytest
import torch
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from fuzz_harness import (
    CASES,
    _params,
    bad_heads,
    bad_quantile,
    branch,
    case,
    cases_in,
    expect,
    fails,
    int_or_wrong,
    name_text,
    non_finite,
    run_branches,
    unknown,
    wrong_type,
)


@case("DynamicAblation", "RandomAblation", "StaticAblation", "HeadAblation", "AblationStats", examples=30)
def _ablations(data, env):
    which = branch(("dynamic", "random", "static", "subclass", "stats"))
    if which == "dynamic":
        score = data.draw(st.one_of(st.just("ahon_ln"), unknown(ih.score_keys()), wrong_type))
        threshold = data.draw(st.one_of(st.just(0.5), non_finite, wrong_type))
        seed = data.draw(st.one_of(st.just(0), wrong_type))
        expect(lambda: ih.DynamicAblation(score, threshold, seed=seed))
    elif which == "random":
        expect(lambda: ih.RandomAblation(data.draw(st.one_of(bad_quantile, wrong_type)),
                                         seed=data.draw(st.one_of(st.just(0), wrong_type))))
    elif which == "static":
        heads = data.draw(bad_heads(env.n_layers, env.n_heads))
        out = expect(lambda: ih.StaticAblation(heads))
        if not isinstance(out, UserError):  # out-of-range heads: known once it meets the model
            fails(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=out, progress=False),
                  names=("head",))
    elif which == "subclass":
        shape = data.draw(st.sampled_from(((1,), (5, 2), (1, env.n_heads + 1))))

        class Wrong(ih.HeadAblation):
            def decide(self, acts):
                return torch.zeros(*shape, dtype=torch.bool)

        fails(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=Wrong(), progress=False))
    else:
        expect(lambda: ih.AblationStats(data.draw(int_or_wrong), data.draw(int_or_wrong)))


@case("ablation_from_spec", "AblationSpec", "ablation_kinds", "register_ablation", "unregister_ablation",
      examples=25)
def _ablation_specs(data, env):
    which = branch(("spec", "dict", "register", "unregister"))
    if which == "spec":
        fields: dict[str, Any] = {"kind": "dynamic", "score": "ahon_ln", "threshold": 0.5}
        field = data.draw(st.sampled_from(("kind", "score", "threshold", "heads", "seed", "params")))
        fields[field] = data.draw(st.one_of(wrong_type, unknown(ih.ablation_kinds()), non_finite))
        spec = expect(lambda: ih.AblationSpec(**fields))
        if not isinstance(spec, UserError):
            expect(lambda: spec.build())
            expect(lambda: ih.ablation_from_spec(spec))
    elif which == "dict":
        d = data.draw(st.one_of(wrong_type, st.dictionaries(
            st.sampled_from(("kind", "score", "threshold", "heads", "seed", "p", "params", "other")),
            st.one_of(wrong_type, unknown(ih.ablation_kinds()), st.sampled_from(ih.ablation_kinds())), max_size=4)))
        expect(lambda: ih.ablation_from_spec(d))
    elif which == "register":
        kind = data.draw(st.one_of(wrong_type, st.sampled_from(ih.ablation_kinds()), name_text))
        cls = data.draw(st.sampled_from((int, object, "x", None)))
        try:
            decorate = expect(lambda: ih.register_ablation(kind))
            if not isinstance(decorate, UserError):
                expect(lambda: decorate(cls))
        finally:
            if isinstance(kind, str) and kind not in ("static", "dynamic", "random") and kind in ih.ablation_kinds():
                ih.unregister_ablation(kind)
    else:
        expect(lambda: ih.unregister_ablation(data.draw(st.one_of(wrong_type, unknown(ih.ablation_kinds()),
                                                                  st.sampled_from(("static", "dynamic"))))))


@case("zero_heads_hook")
def _zero_heads_hook(data, env):
    heads = data.draw(st.one_of(wrong_type, st.lists(st.one_of(st.integers(-10**6, 10**6), wrong_type),
                                                     max_size=3)))
    hook = expect(lambda: ih.zero_heads_hook(heads), names=("heads",))
    if not isinstance(hook, UserError):  # a head index out of range is known once the hook meets z
        z = torch.ones(1, 2, env.n_heads, 8)
        expect(lambda: hook(z, None), names=("head",))


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
