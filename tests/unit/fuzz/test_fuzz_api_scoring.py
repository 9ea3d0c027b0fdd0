"""Scoring and calibration fed wrong input (fuzz_harness.py says the contract)."""

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from tiny import TINY_GQA_VOCAB
from fuzz_harness import (
    CASES,
    INF,
    NAN,
    _params,
    bad_int,
    bad_quantile,
    branch,
    case,
    cases_in,
    expect,
    expect_in,
    fails,
    files,
    name_text,
    non_finite,
    run_branches,
    unknown,
    wrong_type,
)


@case("record_scores", "HeadScores", examples=30)
def _record_scores(data, env):
    n_vocab = TINY_GQA_VOCAB
    which = branch(("inputs", "token_ids", "scores", "batch_size", "model", "attention", "seed"))
    inputs: Any = [[1, 2, 3]]
    kwargs: dict[str, Any] = {"progress": False}
    model, names = env.model, ()
    if which == "inputs":
        inputs = data.draw(st.one_of(
            wrong_type,
            st.lists(st.one_of(st.integers(), st.none(), st.floats()), min_size=1, max_size=3),  # [3]: not lists
            st.lists(st.lists(st.integers(min_value=-10**9, max_value=10**9), min_size=0, max_size=5),
                     min_size=0, max_size=3),  # ids out of the vocabulary, empty inputs
            st.lists(st.lists(st.sampled_from((0.5, NAN, "a", None, 3)), min_size=1, max_size=3), min_size=1,
                     max_size=2),
            st.just([[1] * 200]),  # longer than the context
            st.just([""]),
        ))
    elif which == "token_ids":  # one id outside the vocabulary, among good ones
        bad_id = data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=n_vocab)))
        inputs = [[1, 2, bad_id, 3]]
        names = ("token id",)
    elif which == "scores":
        scores_arg = data.draw(st.one_of(unknown(ih.score_keys()), wrong_type,
                                         st.lists(st.one_of(unknown(ih.score_keys()), wrong_type), max_size=3)))
        kwargs["scores"] = scores_arg
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "attention":
        kwargs["attention"] = data.draw(st.one_of(unknown(("exact", "fast")), wrong_type))
        names = ("attention",)
    elif which == "seed":
        kwargs["seed"] = data.draw(st.one_of(st.integers(-10**30, 10**30), wrong_type))
    else:
        model = data.draw(st.one_of(wrong_type, st.just(ih.DEFAULT_MODEL)))
        names = ("model",)
    out = expect(lambda: ih.record_scores(model, inputs, **kwargs), names=names)
    if not isinstance(out, UserError):  # only valid token ids get through
        assert isinstance(out, ih.HeadScores) and which != "token_ids"
        for seq in inputs if which == "inputs" else ():
            assert all(0 <= t < n_vocab for t in seq)
    # HeadScores built by hand, indexed, subset
    bad_tensors = data.draw(st.one_of(wrong_type, st.dictionaries(name_text, st.one_of(
        wrong_type, st.sampled_from((torch.zeros(2), torch.zeros(2, 3, 4), torch.zeros(1, 1)))), max_size=2)))
    expect(lambda: ih.HeadScores(bad_tensors))
    expect(lambda: env.scores[data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))])
    index = data.draw(st.one_of(st.lists(st.integers(-10**6, 10**6), max_size=3), wrong_type))
    expect(lambda: env.scores.subset(index))


@case("HeadScores.load/save")
def _head_scores_files(data, env):
    path = data.draw(st.one_of(files(env, "heads.json", "text.txt"), wrong_type))
    fails(lambda: ih.HeadScores.load(path))
    scratch = env.scratch()
    target = data.draw(st.one_of(wrong_type, st.sampled_from((scratch / "no/dir/s.safetensors", scratch,
                                                               Path("/proc/forbidden.safetensors")))))
    expect_in(scratch, lambda: env.scores.save(target))


@case("calibrate", "Thresholds", "DEFAULT_QUANTILES", examples=30)
def _calibrate(data, env):
    which = branch(("quantiles", "key", "scores", "direction", "thresholds"))
    key, quantiles, scores, direction = "ahon_ln", list(ih.DEFAULT_QUANTILES), env.scores, None
    names: tuple[str, ...] = ()
    if which == "quantiles":
        quantiles = data.draw(st.one_of(
            st.lists(bad_quantile, min_size=1, max_size=3).map(lambda bad: list(ih.DEFAULT_QUANTILES) + bad),
            st.just([]), wrong_type))
        names = ("quantiles",)
    elif which == "key":
        key = data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))
    elif which == "scores":
        scores = data.draw(st.one_of(wrong_type, st.sampled_from((
            torch.tensor([NAN, 1.0]), torch.tensor([]), torch.full((2, 3, 4), INF), [1.0, NAN], "scores.pt"))))
    elif which == "direction":
        direction = data.draw(st.one_of(unknown(("below", "above")), wrong_type))
        names = ("direction",)
    else:
        t = ih.calibrate(env.scores, "ahon_ln", [0.1, 0.3])
        expect(lambda: t.at(data.draw(st.one_of(bad_quantile, st.floats(0, 0.99), wrong_type))))
        fields = {"key": "k", "quantiles": [0.1], "values": [1.0], "direction": "below"}
        field = data.draw(st.sampled_from(sorted(fields)))
        fields[field] = data.draw(wrong_type)
        expect(lambda: ih.Thresholds(**fields))
        broken = {k: v for k, v in t.to_dict().items() if k != data.draw(st.sampled_from(sorted(t.to_dict())))}
        expect(lambda: ih.Thresholds.from_dict(data.draw(st.one_of(st.just(broken), wrong_type))))
        return
    expect(lambda: ih.calibrate(scores, key, quantiles, direction=direction), names=names)


@case("official_thresholds", "official_models", examples=15)
def _official(data, env):
    models = ih.official_models("mmlu")
    model = data.draw(st.one_of(unknown(models), wrong_type, st.sampled_from(models)))
    task = data.draw(st.one_of(unknown(("mmlu", "piqa", "winogrande")), wrong_type, st.just("mmlu")))
    key = data.draw(st.one_of(unknown(ih.score_keys()), wrong_type, st.just("awft")))
    expect(lambda: ih.official_thresholds(model, task, key))
    expect(lambda: ih.official_models(task))


@case("get_score", "PAPER_SCORES", "score_keys")
def _get_score(data, env):
    key = data.draw(st.one_of(unknown(ih.PAPER_SCORES + ("random", "fho", "fho_ln")), wrong_type))
    fails(lambda: ih.get_score(key), names=(repr(key), str(key)))
    flags = {"include_appendix": data.draw(st.one_of(st.booleans(), wrong_type)),
             "include_random": data.draw(st.one_of(st.booleans(), wrong_type))}
    expect(lambda: ih.score_keys(**flags))


@case("register_score", "unregister_score", "ScoreFunction", "LayerActivations", "layer_normalize", examples=25)
def _register_score(data, env):
    which = branch(("raises", "shape", "nan", "args", "unregister", "is_inactive", "normalize"))
    key = "fuzz_score"
    try:
        if which in ("raises", "shape", "nan"):
            # A registered score function that raises, or returns a wrong shape or NaN, while recording.
            bad = {"raises": lambda acts: 1 / 0, "shape": lambda acts: torch.zeros(3),
                   "nan": lambda acts: torch.full((acts.valid.shape[0], acts.n_heads), NAN)}[which]
            ih.register_score(key, reads=("pattern",), direction="below")(bad)
            fails(lambda: ih.record_scores(env.model, [[1, 2, 3]], [key], progress=False), names=(key,))
        elif which == "args":
            kwargs = {"key": key, "reads": ("pattern",), "direction": "below"}
            field = data.draw(st.sampled_from(("key", "reads", "direction")))
            kwargs[field] = data.draw(st.one_of(wrong_type, name_text, st.lists(name_text, max_size=2)))
            out = expect(lambda: ih.register_score(**kwargs))
            if not isinstance(out, UserError):
                expect(lambda: out(lambda acts: acts.pattern[:, :, -1, 0]))
        elif which == "unregister":
            expect(lambda: ih.unregister_score(data.draw(st.one_of(unknown(ih.score_keys()), wrong_type,
                                                                   st.sampled_from(("awft", "random"))))))
        elif which == "is_inactive":
            fn = ih.get_score("ahon_ln")
            threshold = data.draw(st.one_of(non_finite, wrong_type))
            fails(lambda: fn.is_inactive(torch.rand(2, 3), threshold), names=("threshold",))
        else:
            fails(lambda: ih.layer_normalize(data.draw(st.one_of(
                wrong_type, st.sampled_from((torch.zeros(3), torch.zeros(2, 3, 4), [[1.0, 2.0]]))))),
                names=("scores",))
    finally:
        if key in ih.score_keys():
            ih.unregister_score(key)


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
