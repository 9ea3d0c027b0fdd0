"""The error classes and the models stage fed wrong input (fuzz_harness.py says the contract)."""

from typing import Any

import pytest
import torch
from hypothesis import strategies as st

import inactive_heads as ih
from fuzz_harness import (
    CASES,
    _params,
    _tiny_dir,
    bad_int,
    branch,
    case,
    cases_in,
    expect,
    fails,
    run_branches,
    unknown,
    wrong_type,
)


@case("InactiveHeadsError", "UserError", "UnknownNameError", "MissingFileError", "MissingDependencyError",
      "ModelLoadError", "WrongTypeError", "NonFiniteError", "OutOfRangeError")
def _error_classes(data, env):
    # Each class keeps its one-line message as str(), and is a UserError except the base.
    cls = data.draw(st.sampled_from((ih.UserError, ih.UnknownNameError, ih.MissingFileError, ih.WrongTypeError,
                                     ih.NonFiniteError, ih.OutOfRangeError, ih.MissingDependencyError,
                                     ih.ModelLoadError)))
    message = data.draw(st.text(alphabet="abc '\"xyz;:", min_size=1, max_size=20))
    err = cls(message)
    assert isinstance(err, ih.UserError) and isinstance(err, ih.InactiveHeadsError)
    assert str(err) == message
    assert not isinstance(ih.InactiveHeadsError("x"), ih.UserError)


@case("load_model", "BUILTIN_MODELS", "DEFAULT_MODEL", examples=25)
def _load_model(data, env):
    which = branch(("spec", "dtype", "device", "backend", "n_ctx", "n_devices"))
    # One wrong option with the tiny model's folder (never a built-in model: the fast tier converts none)
    kwargs: dict[str, Any] = {"spec": _tiny_dir(env)}
    names: tuple[str, ...] = ()
    if which == "spec":
        kwargs["spec"] = data.draw(st.one_of(unknown(ih.BUILTIN_MODELS), wrong_type,
                                             st.sampled_from((env.files / "a_folder", env.files / "text.txt"))))
    elif which == "dtype":
        kwargs.update(dtype=data.draw(st.one_of(unknown(("float32", "bfloat16", "float16",
                                                                                  "auto", "fp32", "bf16", "fp16")),
                                                                          wrong_type)))
        names = ("dtype",)
    elif which == "device":
        kwargs.update(device=data.draw(st.one_of(
            st.sampled_from(("gpu", "cuda:99", "cuda", "mps", "tpu", "cuda:-1", "cuda:x", "")), wrong_type)))
        names = ("device",)
    elif which == "backend":
        kwargs.update(backend=data.draw(st.one_of(unknown(("auto", "hooked", "bridge")),
                                                                          wrong_type)))
        names = ("backend",)
    elif which == "n_ctx":
        kwargs.update(n_ctx=data.draw(bad_int.filter(lambda v: v is not None)))
        names = ("n_ctx",)
    else:
        kwargs.update(n_devices=data.draw(st.one_of(st.integers(2, 9), bad_int)))
        names = ("n_devices",)
    spec = kwargs.pop("spec")
    expect(lambda: ih.load_model(spec, progress=False, **kwargs), names=names)


@case("model_info", "ModelInfo")
def _model_info(data, env):
    bad = data.draw(st.one_of(wrong_type, st.sampled_from((ih.DEFAULT_MODEL, env.scores, torch.zeros(3)))))
    fails(lambda: ih.model_info(bad), names=("model",))
    info = ih.model_info(env.model)
    assert isinstance(info, ih.ModelInfo) and info.n_heads == env.n_heads


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
