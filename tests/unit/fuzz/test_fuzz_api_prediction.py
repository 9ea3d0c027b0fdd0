"""The predictors fed wrong input (fuzz_harness.py says the contract)."""

import pytest
import torch
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from fuzz_harness import (
    CASES,
    NAN,
    _damaged_predictor,
    _params,
    _predictor_dir,
    branch,
    case,
    cases_in,
    expect,
    files,
    run_branches,
    tree_hashes,
    wrong_type,
)


@case("PredictedAblation", "Predictor", examples=30)
def _predictor(data, env):
    which = branch(("path", "damaged", "held_heads", "evaluate"))
    if which == "path":
        path = data.draw(st.one_of(wrong_type, files(env)))
        expect(lambda: ih.PredictedAblation(path), names=("path", "predictor", str(path)))
        expect(lambda: ih.Predictor.load(path))
    elif which == "damaged":
        folder = _damaged_predictor(env, data)
        before = tree_hashes(folder)
        for build in (lambda: ih.Predictor.load(folder), lambda: ih.PredictedAblation(folder)):
            out = expect(build)
            if not isinstance(out, UserError):  # a damaged field that still loads must fail on the model
                ablation = out if isinstance(out, ih.PredictedAblation) else None
                if ablation is not None:
                    expect(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=ablation, progress=False))
        assert tree_hashes(folder) == before, "loading a predictor changed its folder"
    elif which == "held_heads":
        predictor = ih.Predictor.load(_predictor_dir(env))
        d = env.model.cfg.d_model
        layer = data.draw(st.one_of(st.just(0), st.integers(-10**6, -1), st.integers(env.n_layers, 10**6), wrong_type))
        resid = data.draw(st.sampled_from((torch.zeros(2, 5, d), torch.zeros(2, 5, d + 1), torch.zeros(5, d),
                                           torch.full((1, 3, d), NAN), None, [[0.0] * d], "x")))
        mask = data.draw(st.sampled_from((None, torch.ones(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long),
                                          torch.ones(3, 7, dtype=torch.long), "x", 3)))
        expect(lambda: predictor.held_heads(layer, resid, mask))
    else:
        spec = {"kind": "predicted", "path": data.draw(st.one_of(wrong_type, files(env)))}
        expect(lambda: ih.ablation_from_spec(spec))
        expect(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=spec, progress=False))


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
