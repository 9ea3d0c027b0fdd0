"""Sweep configs and results folders fed wrong input (fuzz_harness.py says the contract)."""

import shutil

import pytest
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from fuzz_harness import (
    CASES,
    _corrupt,
    _params,
    bad_int,
    bad_quantile,
    branch,
    case,
    cases_in,
    expect,
    expect_in,
    files,
    name_text,
    run_branches,
    tree_hashes,
    unknown,
    wrong_type,
)


@case("SweepConfig", "run_sweep", examples=25)
def _sweep_config(data, env):
    field = branch(("task", "limit", "quantiles", "scores", "dtype", "device", "batch_size", "n_ctx", "thresholds",
                    "subjects", "num_fewshot", "seed", "backend", "ablations", "imports", "static_calibration",
                    "attention", "model"))
    values = {
        "task": st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type),
        "limit": bad_int.filter(lambda v: v is not None),
        "quantiles": st.one_of(st.lists(bad_quantile, min_size=1, max_size=2), st.just([]), wrong_type),
        "scores": st.one_of(st.lists(st.one_of(unknown(ih.score_keys()), wrong_type), min_size=1, max_size=2),
                            wrong_type),
        "dtype": st.one_of(unknown(("float32", "bfloat16", "float16", "auto")), wrong_type),
        "device": st.one_of(st.sampled_from(("gpu", "cuda:99", "tpu", "")), wrong_type),
        "batch_size": bad_int,
        "n_ctx": bad_int.filter(lambda v: v is not None),
        "thresholds": st.one_of(unknown(("calibrated",)), wrong_type, st.just("official:nobody/none")),
        "subjects": st.one_of(st.lists(name_text, max_size=2), wrong_type),
        "num_fewshot": st.one_of(st.integers(max_value=-1), wrong_type),
        "seed": wrong_type,
        "backend": st.one_of(unknown(("auto", "hooked", "bridge")), wrong_type),
        "ablations": st.one_of(wrong_type, st.lists(st.one_of(wrong_type, name_text), min_size=1, max_size=2)),
        "imports": st.one_of(wrong_type, st.lists(st.one_of(wrong_type, name_text), min_size=1, max_size=2)),
        "static_calibration": st.one_of(wrong_type, st.lists(st.integers(-5, 5), max_size=3)),
        "attention": st.one_of(unknown(("exact", "fast")), wrong_type),
        "model": st.one_of(wrong_type, st.just("")),
    }
    kwargs = {"task": "piqa", "limit": 1, "scores": ["ahon_ln"], "quantiles": [0.1], field: data.draw(values[field])}
    config = expect(lambda: ih.SweepConfig(**kwargs))
    if isinstance(config, UserError):
        return
    expect(lambda: config.validate())
    # run_sweep: the bad config is refused before anything is written; an existing folder is untouched
    scratch = env.scratch()
    out = data.draw(st.sampled_from((scratch / "new", scratch / "existing")))
    if out.name == "existing":
        shutil.copytree(env.sweep, out)
    expect_in(scratch, lambda: ih.run_sweep(config, out, model=env.model, progress=False))
    # a config read back from a hand-edited sweep.json
    d = ih.SweepConfig(task="piqa", limit=1).to_dict()
    d[data.draw(st.sampled_from(sorted(d) + ["modle"]))] = data.draw(wrong_type)
    expect(lambda: ih.SweepConfig.from_dict(d))


@case("load_results", "sweep_results", "SweepResults", examples=30)
def _results(data, env):
    folder = env.copy_sweep()
    _corrupt(folder, data)
    before = tree_hashes(folder)
    level = data.draw(st.one_of(st.just("runs"), st.just("questions"), unknown(("runs", "questions")), wrong_type))
    expect(lambda: ih.load_results(folder, level=level))
    results = expect(lambda: ih.sweep_results(folder))
    if not isinstance(results, UserError):
        for use in (lambda: results.baseline_percent, lambda: results.curves(), lambda: results.score_keys,
                    lambda: results.to_dataframe("runs")):
            expect(use)
    expect(lambda: ih.sweep_results(data.draw(st.one_of(wrong_type, files(env)))))
    assert tree_hashes(folder) == before, "reading a results folder changed it"


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
