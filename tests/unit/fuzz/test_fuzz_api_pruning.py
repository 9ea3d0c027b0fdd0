"""Static heads, savings and export fed wrong input (fuzz_harness.py says the contract)."""

from typing import Any

import pytest
import torch
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from fuzz_harness import (
    CASES,
    NAN,
    _params,
    bad_fraction,
    bad_heads,
    bad_int,
    branch,
    case,
    cases_in,
    expect,
    expect_in,
    fails,
    files,
    int_or_wrong,
    run_branches,
    unknown,
    wrong_type,
)


@case("static_heads", "HeadSet", examples=25)
def _static_heads(data, env):
    which = branch(("fraction", "key", "rule", "scores", "headset", "load"))
    args: dict[str, Any] = {"head_scores": env.scores, "key": "ahon_ln", "fraction": 0.3}
    names: tuple[str, ...] = ()
    if which == "fraction":
        args["fraction"] = data.draw(st.one_of(bad_fraction, st.just(0.001)))
        names = ("fraction",)
    elif which == "key":
        args["key"] = data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))
    elif which == "rule":
        args["rule"] = data.draw(st.one_of(unknown(("flag_rate", "mean")), wrong_type))
        names = ("rule",)
    elif which == "scores":
        args["head_scores"] = data.draw(st.one_of(wrong_type, st.sampled_from((torch.zeros(3), torch.full((2, 3, 4),
                                                                                                            NAN)))))
    elif which == "headset":
        heads = data.draw(bad_heads(env.n_layers, env.n_heads))
        expect(lambda: ih.HeadSet(heads, n_layers=env.n_layers, n_heads=env.n_heads), names=("head",))
        expect(lambda: ih.HeadSet(((0, 0),), n_layers=data.draw(int_or_wrong), n_heads=data.draw(int_or_wrong)))
        return
    else:
        fails(lambda: ih.HeadSet.load(data.draw(st.one_of(files(env, "text.txt"), wrong_type))))
        return
    expect(lambda: ih.static_heads(**args), names=names)


@case("savings", "oracle_savings", "paper_projections", "ModelShape", "Savings", examples=25)
def _savings(data, env):
    which = branch(("heads", "seq_len", "dtype", "model", "oracle", "projections", "shape"))
    args: dict[str, Any] = {"model": env.model, "heads": [(0, 0)]}
    names: tuple[str, ...] = ()
    if which == "heads":
        args["heads"] = data.draw(bad_heads(env.n_layers, env.n_heads))
    elif which == "seq_len":
        args["seq_len"] = data.draw(bad_int)
        names = ("seq_len",)
    elif which == "dtype":
        args["dtype"] = data.draw(st.one_of(unknown(("float32", "bfloat16", "float16")), wrong_type))
        names = ("dtype",)
    elif which == "model":
        args["model"] = data.draw(st.one_of(wrong_type, unknown(("meta-llama/Llama-3.1-8B",))))
    elif which == "oracle":
        flagged = data.draw(st.one_of(wrong_type, st.sampled_from((
            torch.zeros(2, env.n_layers, env.n_heads), torch.zeros(2, 1, 1, dtype=torch.bool),
            torch.zeros(3, dtype=torch.bool)))))
        lengths = data.draw(st.one_of(st.none(), wrong_type, st.lists(st.integers(-5, 5), max_size=3)))
        expect(lambda: ih.oracle_savings(env.model, flagged, lengths=lengths))
        return
    elif which == "projections":
        expect(lambda: ih.paper_projections(data.draw(st.one_of(bad_fraction, wrong_type)),
                                            seq_len=data.draw(st.one_of(st.just(2048), bad_int))))
        return
    else:
        d = ih.ModelShape(name="m", family="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
                          d_mlp=64, vocab_size=100).to_dict()
        field = data.draw(st.sampled_from(sorted(d)))
        broken = data.draw(st.one_of(st.just({k: v for k, v in d.items() if k != field}),
                                     st.just({**d, field: data.draw(st.one_of(wrong_type, st.integers(-5, 0)))})))
        shape = expect(lambda: ih.ModelShape.from_dict(broken))
        if not isinstance(shape, UserError):
            expect(lambda: ih.savings(shape, [(0, 0)]))
        return
    expect(lambda: ih.savings(**args), names=names)


@case("export_pruned", examples=12)
def _export(data, env):
    scratch = env.scratch()
    (scratch / "full").mkdir()
    (scratch / "full" / "keep.txt").write_text("keep")
    which = branch(("heads", "mode", "out", "model", "dtype"))
    args: dict[str, Any] = {"model": env.model, "heads": [(0, 0)], "out_dir": scratch / "out"}
    if which == "heads":
        args["heads"] = data.draw(st.one_of(bad_heads(env.n_layers, env.n_heads), st.just([])))
    elif which == "mode":
        args["mode"] = data.draw(st.one_of(unknown(("zeroed", "pruned")), wrong_type))
    elif which == "out":
        args["out_dir"] = data.draw(st.one_of(wrong_type, st.sampled_from((scratch / "full", env.files / "text.txt"))))
    elif which == "model":
        args["model"] = data.draw(st.one_of(wrong_type, unknown(ih.BUILTIN_MODELS),
                                            st.sampled_from((env.files / "a_folder",))))
    else:
        args["dtype"] = data.draw(st.one_of(unknown(("float32", "bfloat16", "float16")), wrong_type))
    out = expect_in(scratch, lambda: ih.export_pruned(**args))
    assert (scratch / "full" / "keep.txt").read_text() == "keep"
    del out


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
