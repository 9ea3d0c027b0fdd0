"""A GSM8K sweep on real SmolLM2 in both decision modes: thresholds from the prompts' scores, each
run equal to ``ih.evaluate`` of the same ablation and mode, records with the generations, resume."""

import importlib

import pytest

import inactive_heads as ih
from inactive_heads.evaluation.gsm8k import build_gsm8k_requests
from inactive_heads.sweep.run import run_sweep
from inactive_heads.sweep.config import SweepConfig

generation_module = importlib.import_module("inactive_heads.evaluation.generation")
LIMIT, SHOTS, NEW = 2, 0, 6


def config(decision):
    return SweepConfig(model="smollm2-135m", task="gsm8k", limit=LIMIT, num_fewshot=SHOTS, max_gen_toks=NEW,
                       scores=["ahon_ln"], quantiles=[0.0, 0.2], include_random=False, batch_size=1,
                       decision=decision)


@pytest.fixture(scope="module", params=["per_step", "prompt"])
def sweep(request, smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"gsm8k-{request.param}")
    return request.param, run_sweep(config(request.param), out, model=smollm2, progress=False)


def test_thresholds_come_from_the_prompts_scores(sweep, smollm2):
    _, results = sweep
    requests = build_gsm8k_requests(smollm2.tokenizer, limit=LIMIT, num_fewshot=SHOTS,
                                    apply_chat_template=True)  # SmolLM2-Instruct: chat, as the sweep
    prompts = [list(r.context_ids) for r in requests]
    scores = ih.record_scores(smollm2, prompts, ["ahon_ln"], progress=False)["ahon_ln"]
    tau = results.thresholds["ahon_ln"]
    assert tau.n_scores == LIMIT * 30 * 9  # the prompts' scores alone: 2 prompts x 30 layers x 9 heads
    assert tau.at(0.0) == pytest.approx(float(scores.min()), abs=1e-6)  # p = 0 is the pooled minimum


def test_every_run_equals_evaluate_with_the_same_ablation_and_mode(sweep, smollm2):
    decision, results = sweep
    assert results.is_complete and results.config.decision == decision
    assert results.records["ahon_ln@p=0.0"].reused_from is None  # generation runs always run
    for rid in ("baseline", "ahon_ln@p=0.2"):
        rec = results.records[rid]
        assert rec.decision == decision and rec.n == LIMIT
        ablation = None if rec.score is None else ih.DynamicAblation("ahon_ln", rec.threshold)
        direct = ih.evaluate(smollm2, "gsm8k", ablation=ablation, decision=decision, limit=LIMIT,
                             num_fewshot=SHOTS, max_gen_toks=NEW, batch_size=3, progress=False)
        assert rec.generations == direct.generations
        assert rec.correct == direct.correct and rec.correct_flexible == direct.correct_flexible
        assert [a["strict-match"] for a in rec.answers] == [a["strict-match"] for a in direct.answers]
        assert rec.realized_fraction == pytest.approx(direct.realized_fraction, abs=1e-12)
    assert results.records["ahon_ln@p=0.2"].realized_fraction > 0
    assert results.records["baseline"].realized_fraction == 0.0


def test_the_table_and_the_questions(sweep):
    _, results = sweep
    table = results.table()
    assert set(table["score"]) == {"ahon_ln"}
    questions = results.to_dataframe("questions")
    assert len(questions) == LIMIT * len(results.records)
    assert questions["gold"].str.contains("####").all()  # GSM8K's worked solutions


def test_a_finished_sweep_resumes_without_generating(sweep, smollm2, monkeypatch):
    decision, results = sweep

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run generated again")

    monkeypatch.setattr(generation_module, "generate", refuse)
    again = run_sweep(config(decision), results.path, model=smollm2, progress=False)
    assert again.records.keys() == results.records.keys()

