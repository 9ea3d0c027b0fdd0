"""Evaluation, generation, tasks, texts and the lm-eval model type fed wrong input (fuzz_harness.py says the contract)."""

from typing import Any

import pytest
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads.core.errors import UserError
from inactive_heads.evaluation.registry import check_task_options
from fuzz_harness import (
    CASES,
    _params,
    bad_int,
    branch,
    case,
    cases_in,
    expect,
    files,
    name_text,
    run_branches,
    unknown,
    wrong_type,
)


@case("evaluate", "plan_evaluation", "EvalPlan", "EvalResult", "TASKS", examples=30)
def _evaluate(data, env):
    which = branch(("task", "limit", "subjects", "num_fewshot", "ablation", "model", "plan", "result", "attention",
                    "batch_size"))
    kwargs: dict[str, Any] = {"limit": 1}
    task: Any = "piqa"
    model = env.model
    names: tuple[str, ...] = ()
    if which == "task":
        task = data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type))
    elif which == "limit":
        kwargs["limit"] = data.draw(bad_int.filter(lambda v: v is not None))
        names = ("limit",)
    elif which == "subjects":
        task = "mmlu"
        kwargs["subjects"] = data.draw(st.one_of(st.just([]), st.lists(st.one_of(name_text, wrong_type), min_size=1,
                                                                                 max_size=2), st.just(3)))
    elif which == "num_fewshot":
        kwargs["num_fewshot"] = data.draw(st.one_of(st.integers(max_value=-1), st.integers(6, 10**6), wrong_type))
        names = ("num_fewshot", "few-shot")
    elif which == "ablation":
        kwargs["ablation"] = data.draw(st.one_of(wrong_type, name_text, st.sampled_from(("ahon_ln@nan", "ahon_ln@x",
                                                                                         "static:99.0", "zz@0.5"))))
    elif which == "attention":
        kwargs["attention"] = data.draw(st.one_of(wrong_type, unknown(("exact", "fast"))))
        names = ("attention",)
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "model":
        model = data.draw(st.one_of(wrong_type, st.just(ih.DEFAULT_MODEL)))
        names = ("model",)
    elif which == "plan":
        plan = ih.plan_evaluation(env.model, "piqa", limit=1)
        expect(lambda: plan.subset(data.draw(st.one_of(st.lists(st.integers(-10**6, 10**6), max_size=3),
                                                       wrong_type))))
        field = data.draw(st.sampled_from(("requests", "inputs", "targets", "metrics")))
        broken = dict(vars(plan))
        broken[field] = data.draw(st.one_of(wrong_type, st.just([])))
        hand = expect(lambda: ih.EvalPlan(**broken))
        if not isinstance(hand, UserError):
            expect(lambda: ih.evaluate(env.model, hand, progress=False))
        expect(lambda: ih.plan_evaluation(env.model, data.draw(st.one_of(unknown(ih.TASKS), wrong_type))))
        return
    else:  # a record read back: EvalResult.from_dict of a foreign or truncated dict
        good = ih.EvalResult(task="piqa", accuracy=0.5, n=2, correct=[True, False],
                             loglikelihoods=[[-1.0, -2.0], [-1.0, -0.5]]).to_dict()
        drop = data.draw(st.sampled_from(sorted(good)))
        bad = data.draw(st.one_of(wrong_type, st.just({k: v for k, v in good.items() if k != drop}),
                                  st.just({**good, drop: data.draw(wrong_type)})))
        expect(lambda: ih.EvalResult.from_dict(bad))
        return
    expect(lambda: ih.evaluate(model, task, progress=False, **kwargs), names=names)


@case("generate", "evaluate_generation", "GenerationOutput", "GenerationResult", examples=25)
def _generate(data, env):
    which = branch(("prompts", "max_new_tokens", "decision", "ablation", "until", "eos", "batch_size",
                    "evaluate_generation", "result"))
    prompts: Any = [[1, 2, 3]]
    kwargs: dict[str, Any] = {"max_new_tokens": 2, "progress": False}
    names: tuple[str, ...] = ()
    if which == "prompts":
        prompts = data.draw(st.one_of(wrong_type, st.just([]), st.just([[]]), st.just(["t1 t2"]),
                                      st.lists(st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=3),
                                               min_size=1, max_size=2)))
    elif which == "max_new_tokens":
        kwargs["max_new_tokens"] = data.draw(st.one_of(bad_int, st.integers(64, 10**6)))
        names = ("max_new_tokens",)
    elif which == "decision":
        kwargs["decision"] = data.draw(st.one_of(unknown(("per_step", "prompt")), wrong_type))
        names = ("decision",)
    elif which == "ablation":
        kwargs["ablation"] = data.draw(st.one_of(wrong_type, st.just(ih.StaticAblation([(99, 0)]))))
    elif which == "until":
        kwargs["until"] = data.draw(st.one_of(wrong_type, st.lists(wrong_type, min_size=1, max_size=2)))
    elif which == "eos":
        kwargs["eos_token_id"] = data.draw(st.one_of(wrong_type, st.integers(-10**6, -1)))
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "evaluate_generation":
        task = data.draw(st.one_of(st.just("gsm8k"), unknown(("gsm8k",)), wrong_type, st.sampled_from(ih.TASKS)))
        limit = data.draw(st.one_of(st.just(1), bad_int))
        expect(lambda: ih.evaluate_generation(env.model, task, limit=limit, max_gen_toks=2, progress=False))
        return
    else:
        good = ih.GenerationResult(task="gsm8k", accuracy=0.0, accuracy_flexible=0.0, n=1, correct=[False],
                                   correct_flexible=[False], generations=["x"], answers=[{}], golds=["1"]).to_dict()
        drop = data.draw(st.sampled_from(sorted(good)))
        expect(lambda: ih.GenerationResult.from_dict(data.draw(st.one_of(
            wrong_type, st.just({k: v for k, v in good.items() if k != drop})))))
        expect(lambda: ih.GenerationOutput(tokens=data.draw(wrong_type), decision="prompt", use_cache=True))
        return
    out = expect(lambda: ih.generate(env.model, prompts, **kwargs), names=names)
    assert isinstance(out, (UserError, ih.GenerationOutput))


@case("load_docs", "build_requests", "task_spec", "TaskSpec", "plan_for_task", examples=20)
def _tasks(data, env):
    which = branch(("load_docs", "build_requests", "task_spec", "plan_for_task"))
    task = data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type, st.sampled_from(ih.TASKS)))
    limit = data.draw(st.one_of(st.just(1), bad_int))
    source = data.draw(st.one_of(st.none(), files(env)))
    if which == "load_docs":
        expect(lambda: ih.load_docs(task, limit=limit, source=source))
    elif which == "build_requests":
        tokenizer = data.draw(st.one_of(st.just(env.model.tokenizer), wrong_type))
        expect(lambda: ih.build_requests(task, tokenizer, limit=limit, source=source))
    elif which == "task_spec":
        spec = expect(lambda: ih.task_spec(task))
        if not isinstance(spec, UserError):
            subjects = data.draw(st.one_of(st.none(), wrong_type))
            expect(lambda: check_task_options(spec.name, limit=limit, subjects=subjects))
    else:
        expect(lambda: ih.plan_for_task(env.model, task, limit=limit, source=source))


# One wrong field of a Task each (the rest a valid multiple-choice task): register_task refuses it.
_BAD_TASK_FIELDS = {
    "name": st.one_of(wrong_type, st.sampled_from(("", " t", "lm-eval:t"))),
    "kind": st.one_of(unknown(("multiple_choice", "generation")), wrong_type),
    "metrics": st.one_of(wrong_type, st.sampled_from(((), ("acc_norm",), ("acc", "f1"), ([1],), ("exact_match",)))),
    "num_fewshot": bad_int.filter(lambda v: v != 0 and v is not None),
    "fewshot_sampler": st.one_of(unknown(("default", "first_n")), wrong_type),
    "docs": st.sampled_from((3, "x", b"x", 2.5, True)),
    "doc_to_text": st.just(None),
}


@case("Task", "register_task", "unregister_task", "get_task", examples=20)
def _task_registry(data, env):
    which = branch(("task", "register", "unregister", "get"))
    if which == "task":
        field = data.draw(st.sampled_from(sorted(_BAD_TASK_FIELDS)))
        fields = {"name": "fuzz_task", "docs": {"test": []}, "doc_to_text": str, "doc_to_choice": list,
                  "doc_to_target": len, field: data.draw(_BAD_TASK_FIELDS[field])}
        out = expect(lambda: ih.register_task(ih.Task(**fields)))
        assert isinstance(out, UserError), f"a task with a bad {field} was registered"
    elif which == "register":
        expect(lambda: ih.register_task(data.draw(wrong_type)))
        builtin = ih.get_task(data.draw(st.sampled_from(ih.TASKS)))
        assert isinstance(expect(lambda: ih.register_task(builtin, overwrite=True)), UserError)
    elif which == "unregister":
        name = data.draw(st.one_of(st.sampled_from(ih.TASKS), unknown(ih.TASKS + ("gsm8k",)), wrong_type))
        assert isinstance(expect(lambda: ih.unregister_task(name)), UserError)
    else:
        expect(lambda: ih.get_task(data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type))))


@case("read_text_file", "lambada_passages")
def _texts(data, env):
    path = data.draw(st.one_of(files(env, "blank.txt"), wrong_type))
    expect(lambda: ih.read_text_file(path))
    kwargs = {name: data.draw(st.one_of(bad_int, st.integers(10**5, 10**7)))
              for name in data.draw(st.sets(st.sampled_from(("n", "min_tokens", "max_tokens")), min_size=1))}
    tokenizer = data.draw(st.one_of(st.none(), wrong_type))
    expect(lambda: ih.lambada_passages(tokenizer=tokenizer, **kwargs))


@case("lm_eval_model", examples=8)
def _lm_eval_model(data, env):
    model = data.draw(st.one_of(wrong_type, unknown(ih.BUILTIN_MODELS)))
    ablation = data.draw(st.one_of(st.none(), wrong_type, name_text))
    expect(lambda: ih.lm_eval_model(model, ablation))


@pytest.mark.parametrize("name", _params(cases_in(__name__)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)
