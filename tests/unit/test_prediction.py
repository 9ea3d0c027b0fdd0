"""The causal predictor of the in-pass oracle (inactive_heads/prediction): probe fitting, the
decision threshold, pooling, files, and PredictedAblation against an independent per-sequence
zeroing — on tiny random-weight models of both TransformerLens lines (GQA)."""

import json
import os

import numpy as np
import pytest
import torch
from tiny import random_sequences, tiny_gqa_model
from tiny_predictor import TAU, fit_tiny_predictor, tiny_plan

import inactive_heads as ih
from inactive_heads import cli
from inactive_heads.core.errors import UserError
from inactive_heads.prediction.oracle import collect_oracle
from inactive_heads.prediction.probe import (FitOptions, Predictor, PredictorConfig, compare, decision_threshold,
                                             fit_predictor, pooled_features)


# ----------------------------------------------------------------------------------------------
# Probe, threshold, pooling (no model)


def planted(n, n_layers=3, d=24, n_heads=5, seed=0, lookahead=0):
    """Features and flags from a known rank-2 linear rule per layer, reading layer l - lookahead."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_layers, d, generator=gen)
    w = torch.randn(n_layers, d, 2, generator=gen) @ torch.randn(n_layers, 2, n_heads, generator=gen)
    b = torch.randn(n_layers, n_heads, generator=gen)
    flags = torch.stack([x[:, max(l - lookahead, 0)] @ w[l] + b[l] > 0 for l in range(n_layers)], dim=1)
    return x, flags


@pytest.mark.parametrize("lookahead", [0, 1])
def test_the_probe_recovers_a_planted_linear_rule_on_held_out_sequences(lookahead):
    x, flags = planted(900, lookahead=lookahead)
    predictor = fit_predictor(x[:600], flags[:600], lookahead=lookahead,
                              options=FitOptions(rank=4, steps=400, lr=0.05, l2=0.0))
    held = compare(predictor.predict(x[600:]), flags[600:]).summary()
    assert held["mean_precision"] > 0.95 and held["mean_recall"] > 0.95, held
    # the rule of layer 2 is not readable from the other layer's features: a wrong lookahead fails
    other = fit_predictor(x[:600], flags[:600], lookahead=1 - lookahead,
                          options=FitOptions(rank=4, steps=400, lr=0.05, l2=0.0))
    wrong = compare(other.predict(x[600:]), flags[600:])
    assert wrong.precision[2] < 0.9 or wrong.recall[2] < 0.9


def test_the_decision_threshold_matches_the_oracle_fraction_on_the_fit_split():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 4, 16, generator=gen)
    flags = torch.rand(300, 4, 6, generator=gen) < 0.13  # unpredictable: the threshold alone sets the fraction
    predictor = fit_predictor(x, flags, options=FitOptions(rank=3, steps=50))
    target = flags.double().mean().item()
    held = predictor.predict(x).double().mean().item()  # counted here, not read from the fit metrics
    assert abs(held - target) <= 0.005
    assert abs(predictor.config.fit["metrics"]["predicted_fraction"] - held) < 1e-12


def test_decision_threshold_holds_k_of_n_by_hand():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.9, 5.0, -3.0, 0.0, 1.1])  # sorted: 5, 2, 1.1, 0.9, 0.3, 0, -1, -3
    assert decision_threshold(logits, 3 / 8) == pytest.approx((1.1 + 0.9) / 2)
    assert decision_threshold(logits, 0.0) > 5.0 and decision_threshold(logits, 1.0) < -3.0


def test_pooling_ignores_pads_left_or_right_and_the_batch():
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randn(k, 8, generator=gen) * 3 for k in (5, 2, 7)]

    def by_hand(r):  # numpy, token by token
        a = r.numpy().astype(np.float64)
        return np.mean([t / np.sqrt(np.mean(t ** 2) + 1e-6) for t in a], axis=0)

    width = 9
    for side in ("left", "right"):
        resid = torch.full((3, width, 8), float("nan"))  # pads hold garbage
        mask = torch.zeros(3, width, dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            resid[i, sl], mask[i, sl] = r, 1
        pooled = pooled_features(resid, mask)
        for i, r in enumerate(rows):
            np.testing.assert_allclose(pooled[i].numpy(), by_hand(r), atol=1e-5)
            alone = pooled_features(r[None])  # batch of one, no mask
            assert torch.allclose(pooled[i], alone[0], atol=1e-5)


def test_compare_counts_precision_and_recall_by_hand():
    oracle = torch.tensor([[[1, 0, 1], [0, 0, 0]], [[1, 1, 0], [0, 1, 0]]], dtype=torch.bool)
    pred = torch.tensor([[[1, 1, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 0]]], dtype=torch.bool)
    c = compare(pred, oracle)
    # layer 0: tp 2 (s0h0, s1h0), predicted 3, oracle 4; layer 1: nothing predicted, 1 in the oracle
    assert c.precision[0] == pytest.approx(2 / 3) and c.recall[0] == pytest.approx(2 / 4)
    assert c.precision[1] != c.precision[1] and c.recall[1] == 0.0
    assert c.micro_precision == pytest.approx(2 / 3) and c.micro_recall == pytest.approx(2 / 5)


def test_the_cost_fraction_uses_the_flop_model():
    shape = ih.ModelShape(name="m", family="llama", n_layers=30, n_heads=9, n_kv_heads=3, d_head=64, d_model=576,
                          d_mlp=1536, vocab_size=49152)
    config = PredictorConfig("m", 30, 9, 576, "ahon_ln", 0.5, 0, 16, 0.0)
    p = Predictor(config, torch.zeros(30, 576), torch.ones(30, 576), torch.zeros(30, 576, 16),
                  torch.zeros(30, 16, 9), torch.zeros(30, 9))
    T = 100
    # one layer by hand: per token 9 query heads (4·d·dh + 4·dh·attended), 3 KV heads (4·d·dh), gated MLP 6·d·dmlp
    flops = sum(9 * (4 * 576 * 64 + 4 * 64 * (t + 1)) + 3 * 4 * 576 * 64 + 6 * 576 * 1536 for t in range(T))
    assert p.cost_fraction(shape, T) == pytest.approx((3 * 576 * T + 2 * 576 + 576 * 16 + 16 * 9) / (flops / 2))


# ----------------------------------------------------------------------------------------------
# On tiny models of the installed TransformerLens line


@pytest.fixture(scope="module")
def tiny():
    return tiny_gqa_model(seed=2)


@pytest.fixture(scope="module")
def features(tiny):
    """Pooled features of the tiny model's oracle pass, for a hand-made (unfitted) predictor."""
    plan = tiny_plan(random_sequences(16, seed=11, min_len=6, max_len=20))
    return collect_oracle(tiny, plan, "ahon_ln", TAU).features


def hand_predictor(tiny, features, lookahead, directory):
    """Random probes on standardized features, cut at 0: decisions that vary with the sequence
    and with the layer read (so reading the wrong layer shows)."""
    info = ih.model_info(tiny)
    L, H, d, r = info.n_layers, info.n_heads, info.d_model, 3
    gen = torch.Generator().manual_seed(7)
    config = PredictorConfig("tiny", L, H, d, "ahon_ln", TAU, lookahead, r, 0.0)
    p = Predictor(config, features.mean(0), features.std(0).clamp_min(1e-6), torch.randn(L, d, r, generator=gen),
                  torch.randn(L, r, H, generator=gen), torch.zeros(L, H))
    p.save(directory)
    return p


class ZeroMasks(ih.HeadAblation):
    """Zero, per sequence id and layer, the heads of a given mask (written from scratch, unregistered)."""

    def __init__(self, masks):
        super().__init__()
        self.masks = masks

    def decide(self, acts):
        return self.masks[acts.sequence_ids, acts.layer].to(acts.z.device)


def predicted_run(tiny, features, directory, lookahead):
    """A hand-made predictor saved in ``directory``, and PredictedAblation(directory) run on six
    sequences: (predictor, tokens, logits, per-sequence held mask), the mask neither empty nor full."""
    p = hand_predictor(tiny, features, lookahead, directory)
    tokens = torch.tensor(random_sequences(6, seed=21, min_len=10, max_len=10))
    abl = ih.PredictedAblation(directory)
    with abl.apply(tiny), torch.inference_mode():
        logits = tiny(tokens)
    masks = abl.stats.flagged_mask()
    assert masks.any() and not masks.all()
    return p, tokens, logits, masks


@pytest.mark.parametrize("lookahead", [0, 1])
def test_predicted_ablation_zeroes_exactly_the_heads_held_heads_returns(tiny, features, tmp_path, lookahead):
    p, tokens, logits, masks = predicted_run(tiny, features, tmp_path, lookahead)
    info = ih.model_info(tiny)
    assert not all(torch.equal(masks[0], masks[i]) for i in range(1, 6))  # decisions differ per sequence
    # The same heads zeroed by a per-sequence mask; the stream entering each layer read by plain hooks.
    resid = {}
    hooks = [(f"blocks.{l}.hook_resid_pre", lambda x, hook, l=l: resid.__setitem__(l, x.clone()))
             for l in range(info.n_layers)]
    listed = ZeroMasks(masks)
    with listed.apply(tiny), tiny.hooks(fwd_hooks=hooks), torch.inference_mode():
        listed_logits = tiny(tokens)
    assert torch.equal(logits, listed_logits)
    for l in range(info.n_layers):
        held = p.held_heads(l, resid[max(l - lookahead, 0)], None)
        assert torch.equal(held, masks[:, l]), l
        if lookahead == 1 and l > 0:  # the other layer's stream would decide otherwise
            assert not torch.equal(p.held_heads(l, resid[l], None), held)


def test_predicted_decisions_do_not_depend_on_batch_size_or_padding(tiny, features, tmp_path):
    hand_predictor(tiny, features, 1, tmp_path)
    plan = tiny_plan(random_sequences(7, seed=31, min_len=4, max_len=20))
    runs = []
    for batch_size in (1, 3, 7):
        abl = ih.PredictedAblation(tmp_path)
        ih.evaluate(tiny, plan, ablation=abl, batch_size=batch_size, progress=False)
        runs.append(abl.stats.flagged_mask())
    assert runs[0].any() and torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_save_then_load_decides_identically_and_a_mismatched_model_is_a_one_line_error(tiny, tmp_path):
    p = fit_tiny_predictor(tiny, tmp_path / "p", lookahead=1)
    q = Predictor.load(tmp_path / "p")
    assert q.config == p.config
    resid = torch.randn(4, 9, ih.model_info(tiny).d_model)
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, :3] = 0
    for l in range(p.n_layers):
        assert torch.equal(p.held_heads(l, resid, mask), q.held_heads(l, resid, mask))
    stored = json.loads((tmp_path / "p" / "predictor.json").read_text())
    assert stored["lookahead"] == 1 and stored["score"] == "ahon_ln" and stored["threshold"] == TAU
    other = tiny_gqa_model(seed=2, n_layers=2)
    with pytest.raises(UserError, match=r"fit on 'tiny' \(3 layers, 6 heads.*but model .* has 2 layers"):
        ih.evaluate(other, tiny_plan([[3, 4, 5]]), ablation=ih.PredictedAblation(tmp_path / "p"), progress=False)
    with pytest.raises(UserError, match="not found"):
        Predictor.load(tmp_path / "nothing")


def test_a_predicted_ablation_round_trips_its_spec_and_runs_in_generation(tiny, tmp_path):
    fit_tiny_predictor(tiny, tmp_path, lookahead=0)
    spec = json.loads(json.dumps(ih.PredictedAblation(tmp_path).to_spec()))
    assert spec == {"kind": "predicted", "path": str(tmp_path.resolve())}
    prompts = random_sequences(3, seed=41, min_len=5, max_len=9)
    for decision in ("prompt", "per_step"):
        out = ih.generate(tiny, prompts, ablation=spec, decision=decision, max_new_tokens=3, progress=False)
        assert 0.0 < out.realized_fraction < 1.0 and all(len(t) == 3 for t in out.tokens)


def test_predict_command_errors_are_one_line(capsys, tmp_path):
    assert cli.main(["predict", "eval", str(tmp_path), "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inactive-heads predict: error: no predictor in") and err.count("\n") == 1
    assert cli.main(["predict", "fit", "--out", str(tmp_path)]) == 2
    assert "predict fit needs --limit N" in capsys.readouterr().err


def test_the_lm_eval_model_type_runs_a_predicted_ablation_from_its_spec(tiny, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from inactive_heads.lmeval import model as lmeval

    class NoTokenizer:  # token ids come from lm-eval; the tiny model has no tokenizer files
        eos_token_id, bos_token_id, name_or_path = 0, 1, "tiny"

    monkeypatch.setattr(lmeval, "plain_tokenizer", lambda model: NoTokenizer())
    fit_tiny_predictor(tiny, tmp_path, lookahead=1)
    spec = {"kind": "predicted", "path": str(tmp_path.resolve())}
    requests = [(None, ctx, cont) for ctx, cont in
                zip(random_sequences(6, seed=51, min_len=5, max_len=15), random_sequences(6, seed=52, max_len=3))]
    plain = lmeval.InactiveHeadsLM(tiny, progress=False)._loglikelihood_tokens(requests)
    runs = [lmeval.InactiveHeadsLM(tiny, progress=False, ablation=spec, batch_size=b) for b in (1, 4)]
    got = [lm._loglikelihood_tokens(requests) for lm in runs]
    assert [ll for ll, _ in got[0]] == pytest.approx([ll for ll, _ in got[1]], abs=1e-5)
    assert [ll for ll, _ in got[0]] != pytest.approx([ll for ll, _ in plain], abs=1e-3)
    stats = [lm.stats["loglikelihood"] for lm in runs]
    assert stats[0]["ablation"] == spec and 0 < stats[0]["realized_fraction"] == stats[1]["realized_fraction"] < 1


def test_predict_fit_rejects_a_wrong_score_or_output_before_loading_the_model(tmp_path, monkeypatch, capsys):
    def load(args):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(cli.options, "load", load)
    (tmp_path / "notes.txt").write_text("a file")
    for argv, message in ((["--score", "zz", "--out", str(tmp_path / "p")], "unknown score 'zz'"),
                          (["--out", str(tmp_path / "notes.txt")], "notes.txt is a file")):
        assert cli.main(["predict", "fit", "--model", "tiny", "--limit", "4", *argv]) == 2
        assert message in capsys.readouterr().err


def serve_plans(monkeypatch, questions):
    """The task's questions, on the tiny model: ``plan_for_task`` (what fit, eval and the sweep
    under eval plan with) gives the first ``limit`` of each subject asked for (all of them by
    default), from ``questions`` = {subject: (sequences, prompt texts or None)}; a generation task
    (a list in place of the mapping): the first ``limit`` requests. Returns the list of the calls'
    limits."""
    from inactive_heads.evaluation import registry

    calls = []

    def plan_for_task(model, task, *, subjects=None, limit=None, **_):
        calls.append(limit)
        if isinstance(questions, list):
            return questions[:limit]
        seqs, subs, texts = [], [], []
        for subject in subjects or list(questions):
            sequences, names = questions[subject]
            names = [f"q{i}" for i in range(len(sequences))] if names is None else names
            seqs += sequences[:limit]
            subs += [subject] * len(sequences[:limit])
            texts += names[:limit]
        return tiny_plan(seqs, subject=subs, texts=texts)

    monkeypatch.setattr(registry, "plan_for_task", plan_for_task)
    return calls


def fit_both_lookaheads_from_the_command_line(tiny, sequences, n_fit, out, monkeypatch, questions=None,
                                              subjects=None):
    """``predict fit`` of both lookaheads on the tiny model, on the first ``n_fit`` questions of
    ``sequences`` (one subject, anatomy); ``questions``: every subject's questions (for eval too),
    ``subjects``: those the fit takes."""
    monkeypatch.setattr(cli.options, "load", lambda args: tiny)
    serve_plans(monkeypatch, questions or {"anatomy": (sequences, None)})
    assert cli.main(["predict", "fit", "--model", "tiny", "--task", "mmlu", "--threshold", str(TAU), "--lookahead",
                     "0", "1", "--limit", str(n_fit), "--steps", "20", "--rank", "2", "--out", str(out),
                     *(["--subjects", *subjects] if subjects else [])]) == 0


def most_flagged(counts, k, means):
    """The static set by hand, by static_heads' rule: a mask of the ``k`` (layer, head) pairs with the
    most flags, ties by the lower mean score (ahon_ln flags low scores), then by position."""
    chosen = np.zeros(counts.size, dtype=bool)
    chosen[np.lexsort((np.arange(counts.size), means, -counts))[:k]] = True
    return chosen


def flags_and_means(data):
    """An oracle pass's per-(layer, head) flag counts and mean in-pass scores, flattened."""
    return data.flags.sum(dim=0).flatten().numpy(), data.scores.double().mean(dim=0).flatten().numpy()


def test_predict_fit_then_eval_on_held_out_questions_from_the_command_line(tiny, tmp_path, monkeypatch, capsys):
    sequences = random_sequences(24, seed=61, min_len=6, max_len=20)
    out = tmp_path / "p"
    fit_both_lookaheads_from_the_command_line(tiny, sequences, 16, out, monkeypatch)
    assert sorted(p.name for p in out.iterdir()) == ["lookahead-0", "lookahead-1"]
    capsys.readouterr()
    planned = serve_plans(monkeypatch, {"anatomy": (sequences, None)})
    assert cli.main(["predict", "eval", str(out), "--limit", "8", "--baselines"]) == 0
    assert planned == [24]  # the questions are tokenized once: the oracle's pass and the sweep share them
    printed, progress = capsys.readouterr()
    result = json.loads((out / "eval.json").read_text())
    assert result["n_heldout_questions"] == 8 and result["n_fit_questions_in_plan"] == 16
    # the same figures computed here on the last 8 questions alone
    held = collect_oracle(tiny, tiny_plan(sequences[16:]), "ahon_ln", TAU)
    for path, entry in result["predictors"].items():
        expected = compare(Predictor.load(path).predict(held.features), held.flags).to_dict()
        assert entry["teacher_forced"]["summary"] == pytest.approx(expected["summary"], nan_ok=True)
    assert set(result["accuracy"]) == {"oracle", "predicted_lookahead0", "predicted_lookahead1", "static", "random",
                                       "none"}
    # the closed loop: each held-out input alone (batch 1, no padding) under the predictor's ablation
    inputs = tiny_plan(sequences[16:]).inputs
    for path, entry in result["predictors"].items():
        rows = []
        for tokens in inputs:
            abl = ih.PredictedAblation(path)
            with abl.apply(tiny), torch.inference_mode():
                tiny(torch.tensor([tokens]))
            rows.append(abl.stats.flagged_mask()[0])
        expected = compare(torch.stack(rows), held.flags).to_dict()["summary"]
        assert entry["closed_loop"]["summary"] == pytest.approx(expected, nan_ok=True)
    # the runs are a sweep over questions 16..23 alone
    baseline = json.loads((out / "eval" / "runs" / "baseline.json").read_text())
    assert baseline["doc_ids"] == list(range(16, 24))
    capsys.readouterr()
    assert cli.main(["report", str(out / "eval")]) == 0  # a sweep folder as any: one row per run, no curve
    table = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "@" in line.split(" ")[0]]
    assert sorted(name.split("@")[0] for name in table) == ["dynamic", "predicted", "predicted", "random", "static"]
    assert printed.count("\nmean ") == 2
    # the static set against the oracle, by hand: the fit split's most-flagged pairs, held on every input
    fit_counts, fit_means = flags_and_means(collect_oracle(tiny, tiny_plan(sequences[:16]), "ahon_ln", TAU))
    oracle = held.flags.flatten(1).numpy()
    k = result["static_set"]["n_heads"]
    chosen = most_flagged(fit_counts, k, fit_means)
    hits = (oracle & chosen).sum()
    static = result["static_set"]["vs_oracle"]["summary"]
    assert 0 < hits < oracle.sum()
    assert static["micro_precision"] == pytest.approx(hits / (chosen.sum() * oracle.shape[0]))
    assert static["micro_recall"] == pytest.approx(hits / oracle.sum())
    assert result["accuracy"]["static"]["realized_fraction"] == pytest.approx(chosen.mean())  # what the run zeroed
    assert "static set of the same size" in printed
    # a long eval says what it runs, in order, each run's line with the accuracy it returned
    lines = [line for line in progress.splitlines() if line.startswith("predict eval: ")]
    ends = [line.split(": ")[1] for line in lines if ": accuracy " in line]
    assert ends == list(result["accuracy"])
    for name, run in result["accuracy"].items():
        assert any(line.startswith(f"predict eval: {name}: accuracy {100 * run['accuracy']:.1f} %") for line in lines)


def test_a_split_by_subject_ranks_the_static_set_by_the_fits_saved_flags(tiny, tmp_path, monkeypatch, capsys):
    """An eval whose plan holds none of the fit questions (another MMLU subject) still runs the static
    set, ranked by the oracle's flags on the fit questions as the fit saved them; a predictor saved
    without them is a one-line error before the model runs."""
    from inactive_heads.prediction import heldout

    sequences = random_sequences(24, seed=71, min_len=6, max_len=20)
    other = random_sequences(24, seed=72, min_len=6, max_len=20)
    out = tmp_path / "p"
    fit_both_lookaheads_from_the_command_line(tiny, sequences, 16, out, monkeypatch, subjects=["anatomy"],
                                              questions={"anatomy": (sequences, None), "astronomy": (other, None)})
    fit_pass = collect_oracle(tiny, tiny_plan(sequences[:16]), "ahon_ln", TAU)  # an oracle pass of its own
    for folder in out.iterdir():  # what the fit saved: per (layer, head), on how many fit sequences it was held
        assert Predictor.load(folder).config.fit["oracle_flag_counts"] == fit_pass.flags.sum(dim=0).tolist()
    capsys.readouterr()
    argv = ["predict", "eval", str(out), "--limit", "8", "--baselines", "--no-closed-loop", "--subjects", "astronomy"]
    assert cli.main(argv) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["n_fit_questions_in_plan"] == 0 and result["n_heldout_questions"] == 8
    assert set(result["accuracy"]) == {"static", "random", "none"}
    counts, means = flags_and_means(fit_pass)
    held = collect_oracle(tiny, tiny_plan(other[16:]), "ahon_ln", TAU).flags.flatten(1).numpy()  # astronomy 16..23
    k = result["static_set"]["n_heads"]
    chosen = most_flagged(counts, k, means)
    hits = (held & chosen).sum()
    assert 0 < hits < held.sum() and result["static_set"]["ranked_by"] == "the fit's saved counts"
    assert result["static_set"]["vs_oracle"]["summary"]["micro_recall"] == pytest.approx(hits / held.sum())

    for folder in out.iterdir():  # a predictor from before the counts were saved
        if folder.is_dir() and folder.name.startswith("lookahead-"):
            saved = json.loads((folder / "predictor.json").read_text())
            del saved["fit"]["oracle_flag_counts"]
            (folder / "predictor.json").write_text(json.dumps(saved))
    monkeypatch.setattr(heldout, "collect_task_oracle", lambda *a, **k: pytest.fail("the model ran"))
    capsys.readouterr()
    assert cli.main(argv + ["--fresh"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fit it again with predict fit, or drop --baselines" in err[0]


def test_a_plan_holding_some_fit_questions_ranks_the_static_set_by_all_of_them(tiny, tmp_path, monkeypatch, capsys):
    """Eval subjects that overlap the fit's in part: the static set is ranked by the oracle's flags on
    every fit question (as the fit saved them), not on the part the plan holds; without saved counts,
    on that part, said so. A resumed eval whose static set changed is another setup: refused, as a
    sweep's folder is, until --fresh."""
    sequences = random_sequences(24, seed=71, min_len=6, max_len=20)
    seqs = {"anatomy": sequences[:8], "astronomy": sequences[8:]}
    out = tmp_path / "p"
    fit_both_lookaheads_from_the_command_line(tiny, None, 8, out, monkeypatch, subjects=["anatomy", "astronomy"],
                                              questions={name: (s, None) for name, s in seqs.items()})
    # fit questions: anatomy 0-7 and astronomy 0-7; the eval's plan holds astronomy's 0-15
    argv = ["predict", "eval", str(out), "--limit", "8", "--baselines", "--no-closed-loop", "--subjects", "astronomy"]

    def static_set():
        result = json.loads((out / "eval.json").read_text())
        assert result["n_fit_questions_in_plan"] == 8 and result["n_heldout_questions"] == 8
        chosen = np.zeros(tiny.cfg.n_layers * tiny.cfg.n_heads, dtype=bool)
        for layer, head in result["static_set"]["heads"]:
            chosen[layer * tiny.cfg.n_heads + head] = True
        return result["static_set"], chosen

    full = flags_and_means(collect_oracle(tiny, tiny_plan(seqs["anatomy"][:8] + seqs["astronomy"][:8]), "ahon_ln",
                                          TAU))
    part = flags_and_means(collect_oracle(tiny, tiny_plan(seqs["astronomy"][:8]), "ahon_ln", TAU))
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "held on every input, ranked by the fit's saved counts)" in capsys.readouterr().out
    first, chosen = static_set()
    k = first["n_heads"]
    assert k == chosen.sum() and (most_flagged(full[0], k, full[1]) != most_flagged(part[0], k, part[1])).any()
    assert (chosen == most_flagged(full[0], k, full[1])).all() and first["ranked_by"] == "the fit's saved counts"

    for folder in out.iterdir():  # a predictor from before the counts were saved: the part the plan holds
        if folder.is_dir() and folder.name.startswith("lookahead-"):
            saved = json.loads((folder / "predictor.json").read_text())
            del saved["fit"]["oracle_flag_counts"]
            (folder / "predictor.json").write_text(json.dumps(saved))
    capsys.readouterr()
    assert cli.main(argv) == 2  # another static set (known after the oracle's pass): another sweep
    err = capsys.readouterr().err.strip().splitlines()
    assert "holds a different sweep (differs in ablations); run predict eval with --fresh" in err[-1]
    assert sum("error" in line for line in err) == 1
    assert cli.main(argv + ["--fresh"]) == 0
    second, chosen = static_set()
    assert (chosen == most_flagged(part[0], k, part[1])).all()
    assert second["ranked_by"] == "this plan's 8 of the 16 fit questions"


def test_predict_eval_loads_the_model_in_the_dtype_it_was_fit_in(tiny, tmp_path, monkeypatch):
    """The fit saves the model's dtype; eval loads in it unless --dtype says otherwise (a predictor
    fit in bfloat16 evaluated in float32 would read another stream)."""
    sequences = random_sequences(20, seed=81, min_len=6, max_len=20)
    out = tmp_path / "p"
    fit_both_lookaheads_from_the_command_line(tiny, sequences, 12, out, monkeypatch)
    for folder in out.iterdir():
        if folder.is_dir():
            saved = json.loads((folder / "predictor.json").read_text())
            assert saved["fit"]["dtype"] == "float32"  # the tiny model's
            saved["fit"]["dtype"] = "bfloat16"  # as a fit in bfloat16 saves it
            (folder / "predictor.json").write_text(json.dumps(saved))
    asked = []
    monkeypatch.setattr(cli.options, "load", lambda args: asked.append(args.dtype) or tiny)
    argv = ["predict", "eval", str(out), "--limit", "8", "--no-closed-loop"]
    assert cli.main(argv) == 0 and cli.main(argv + ["--dtype", "float32"]) == 0
    assert asked == ["bfloat16", "float32"]


def test_the_group_level_rule_holds_each_kv_group_with_enough_held_heads_whole(tiny, features, tmp_path):
    """PredictedAblation(hold_groups=F) against the plain predictor's decisions, group by group
    (the tiny GQA model: 6 query heads in 2 KV groups of 3)."""
    from inactive_heads.evaluation.generation import decide_on_prompts
    from inactive_heads.pruning import held_fractions, model_shape

    hand_predictor(tiny, features, 0, tmp_path)
    predictor = tmp_path
    prompts = random_sequences(12, seed=91, min_len=5, max_len=18)
    plain = decide_on_prompts(tiny, prompts, ih.PredictedAblation(predictor), batch_size=4)
    grouped = decide_on_prompts(tiny, prompts, ih.PredictedAblation(predictor, hold_groups=0.5), batch_size=5)
    whole = 0
    for s, l, g in np.ndindex(plain.shape[0], plain.shape[1], 2):
        got = grouped[s, l, 3 * g:3 * g + 3].tolist()
        if l == 0:  # later layers read a stream that the extra zeroing before them changed
            heads = plain[s, l, 3 * g:3 * g + 3].tolist()
            assert got == ([True] * 3 if sum(heads) >= 2 else heads)  # 2 of 3 is at least half
        assert all(got) or sum(got) < 2
        whole += all(got)
    assert 0 < plain[:, 0].sum() < grouped[:, 0].sum()  # the rule changed something in layer 0
    assert held_fractions(model_shape(tiny), grouped)["kv_groups"] == whole / (plain.shape[0] * plain.shape[1] * 2)
    assert ih.PredictedAblation(predictor, hold_groups=0.5).to_spec()["hold_groups"] == 0.5
    for bad in (0.0, 1.5, -0.5, float("nan")):
        with pytest.raises(UserError, match="hold_groups"):
            ih.PredictedAblation(predictor, hold_groups=bad)


def _generation_requests(sequences):
    """GSM8K-shaped requests over the tiny model's token ids (each gold answer is "1")."""
    from inactive_heads.evaluation.gsm8k import GenerationRequest

    return [GenerationRequest("gsm8k", i, tuple(seq), " ".join(f"t{t}" for t in seq), ("t3",), "#### 1", f"q{i}")
            for i, seq in enumerate(sequences)]


def test_the_oracle_on_prompts_equals_the_multiple_choice_oracle_on_the_same_inputs(tiny):
    """Two runners (generation's prompt pass, and evaluate over a plan whose forward inputs are the
    same token ids) give the same pooled features and flags, in the same order."""
    from inactive_heads.prediction.oracle import collect_oracle_prompts

    sequences = random_sequences(10, seed=71, min_len=6, max_len=20)
    on_prompts = collect_oracle_prompts(tiny, _generation_requests(sequences), "ahon_ln", TAU, batch_size=3)
    on_plan = collect_oracle(tiny, tiny_plan(sequences), "ahon_ln", TAU, batch_size=4)
    assert on_prompts.lengths == [len(s) for s in sequences] == on_plan.lengths
    assert torch.equal(on_prompts.flags, on_plan.flags) and 0 < on_plan.flags.float().mean() < 1
    assert torch.allclose(on_prompts.features, on_plan.features, atol=1e-5)


def test_predict_fit_then_eval_on_a_generation_task_holds_heads_from_the_prompt(tiny, tmp_path, monkeypatch, capsys):
    """GSM8K's path: fit on the first prompts, evaluate on the rest with generation (decision
    "prompt"); the figures equal those computed here on the held-out prompts alone, one at a time."""
    from inactive_heads.evaluation.generation import decide_on_prompts
    from inactive_heads.prediction.oracle import collect_oracle_prompts

    sequences = random_sequences(22, seed=81, min_len=6, max_len=20)
    requests = _generation_requests(sequences)
    if getattr(tiny, "tokenizer", None) is None:  # the HookedTransformer of TransformerLens 3.9 is built without one
        from tiny import TINY_GQA_VOCAB, _word_tokenizer

        monkeypatch.setattr(tiny, "tokenizer", _word_tokenizer(tmp_path / "tokenizer", TINY_GQA_VOCAB), raising=False)
    monkeypatch.setattr(cli.options, "load", lambda args: tiny)
    serve_plans(monkeypatch, requests)
    out = tmp_path / "g"
    assert cli.main(["predict", "fit", "--model", "tiny", "--task", "gsm8k", "--threshold", str(TAU),
                     "--limit", "14", "--steps", "20", "--rank", "2", "--out", str(out)]) == 0
    assert cli.main(["predict", "eval", str(out), "--limit", "8", "--baselines", "--max-gen-toks", "2",
                     "--batch-size", "3"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["decision"] == "prompt" and result["n_heldout_questions"] == 8
    held = collect_oracle_prompts(tiny, requests[14:], "ahon_ln", TAU, batch_size=1)
    (path, entry), = result["predictors"].items()
    predictor = Predictor.load(path)
    alone = torch.cat([decide_on_prompts(tiny, [list(r.context_ids)], ih.PredictedAblation(path), batch_size=1)
                       for r in requests[14:]])
    assert entry["teacher_forced"]["summary"] == pytest.approx(
        compare(predictor.predict(held.features), held.flags).to_dict()["summary"], nan_ok=True)
    assert entry["closed_loop"]["summary"] == pytest.approx(compare(alone, held.flags).to_dict()["summary"], nan_ok=True)
    assert set(result["accuracy"]) == {"oracle", "predicted_lookahead0", "static", "random", "none"}
    for run in result["accuracy"].values():
        assert len(run["correct"]) == len(run["correct_flexible"]) == 8 and run["n_generated_tokens"] <= 16
    assert result["accuracy"]["oracle"]["realized_fraction"] > 0
    assert "Δ vs none" in capsys.readouterr().out


@pytest.mark.parametrize("lookahead", [0, 1])
def test_really_skipping_what_the_predictor_holds_equals_its_zeroing_simulation(tiny, features, tmp_path, lookahead):
    """The predictor as the decider of the skipping forward (held heads never computed) against
    PredictedAblation (every head computed, the held ones zeroed at hook_z): same logits."""
    from inactive_heads.pruning.skipping import skip_logits

    p, tokens, want, _ = predicted_run(tiny, features, tmp_path, lookahead)
    with torch.inference_mode():
        got = skip_logits(tiny, tokens, decider=p, rule="skip")
    assert float((got - want).abs().max()) <= 1e-5


@pytest.mark.parametrize("lookahead", [0, 1])
def test_prompt_held_generation_decided_inside_the_skipped_prefill_equals_the_simulation(tiny, features, tmp_path,
                                                                                           lookahead):
    """generate(skip=True) with a PredictedAblation decides in the skipped prefill (no decision
    pass): the same held heads per prompt as the simulation's decision pass, the same tokens, and
    the KV bytes of the cache equal to the accountant's."""
    from inactive_heads.evaluation.generation import decide_on_prompts

    hand_predictor(tiny, features, lookahead, tmp_path)
    prompts = random_sequences(5, seed=97, min_len=4, max_len=15)
    simulated = ih.generate(tiny, prompts, ablation=ih.PredictedAblation(tmp_path), decision="prompt",
                            max_new_tokens=4, progress=False)
    skipping = ih.PredictedAblation(tmp_path)
    skipped = ih.generate(tiny, prompts, ablation=skipping, decision="prompt", max_new_tokens=4, skip=True,
                          progress=False)
    expected = decide_on_prompts(tiny, prompts, ih.PredictedAblation(tmp_path), batch_size=2)
    assert skipped.skipping["decided_in_prefill"] and skipped.skipping["batches"] == len(prompts)
    assert torch.equal(skipping.stats.flagged_mask(), expected) and 0 < expected.float().mean() < 1
    assert skipped.tokens == simulated.tokens
    assert skipped.realized_fraction == simulated.realized_fraction
    assert skipped.skipping["kv_bytes_measured_end"] == skipped.skipping["kv_bytes_predicted_end"]


def test_a_stopped_predict_eval_resumes_with_the_runs_it_finished(tiny, tmp_path, monkeypatch, capsys):
    """predict eval's runs are one sweep in DIR/eval: stopped, it resumes with the runs it finished
    (the sweep's records, byte for byte what a fresh eval writes, timings aside); another setup is
    refused with one line before the model runs; a damaged folder too; --fresh starts again."""
    from inactive_heads.ablation.head_ablation import RandomAblation
    from inactive_heads.evaluation import evaluator
    from inactive_heads.prediction import oracle
    from inactive_heads.sweep.record import VOLATILE_FIELDS

    out = tmp_path / "p"
    fit_both_lookaheads_from_the_command_line(tiny, random_sequences(20, seed=67, min_len=6, max_len=20), 12, out,
                                              monkeypatch)
    passes, real_evaluate = [], evaluator.evaluate

    def counted(model, plan, *, ablation=None, **kw):  # every pass of the model, by its ablation's kind
        passes.append(type(ablation).__name__)
        if stop_at is not None and isinstance(ablation, stop_at):
            raise KeyboardInterrupt
        return real_evaluate(model, plan, ablation=ablation, **kw)

    monkeypatch.setattr(oracle, "evaluate", counted)  # the oracle's pass
    monkeypatch.setattr(evaluator, "evaluate", counted)  # the sweep's passes

    def records():
        found = {}
        for f in sorted((out / "eval" / "runs").glob("*.json")):
            d = json.loads(f.read_text())
            found[f.name] = {k: v for k, v in d.items() if k not in VOLATILE_FIELDS}
        return found

    evaluate_cmd = ["predict", "eval", str(out), "--limit", "8", "--baselines"]
    stop_at = RandomAblation  # stopped during the last of six runs
    assert cli.main(evaluate_cmd) == 130
    assert not (out / "eval.json").exists()
    assert passes == ["_OracleWithFeatures", "NoneType", "DynamicAblation", "PredictedAblation", "PredictedAblation",
                      "StaticAblation", "RandomAblation"]
    assert len(records()) == 5 and not any(name.startswith("random@") for name in records())

    stop_at, passes[:] = None, []
    capsys.readouterr()
    assert cli.main(evaluate_cmd) == 0
    assert passes == ["_OracleWithFeatures", "RandomAblation"]  # the oracle's features, then what was left
    resumed, resumed_records = json.loads((out / "eval.json").read_text()), records()
    assert len(resumed_records) == 6

    passes[:] = []
    assert cli.main([*evaluate_cmd, "--fresh"]) == 0
    assert len(passes) == 7
    fresh = json.loads((out / "eval.json").read_text())
    resumed.pop("seconds"), fresh.pop("seconds")
    assert resumed == fresh  # what was taken from the folder is what running it again gives
    assert records() == resumed_records  # the records too, to the value
    assert len({run["realized_fraction"] for run in fresh["accuracy"].values()}) > 2  # the runs differ: a mix-up shows

    # another setup: the group-level rule changes what a run is; as any sweep's folder, it is
    # refused with one line naming what differs, before any pass, and left as it was
    passes[:], before = [], (out / "eval" / "sweep.json").read_bytes()
    capsys.readouterr()
    assert cli.main([*evaluate_cmd, "--hold-groups", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a different sweep (differs in ablations); run predict eval with --fresh" in err[0]
    assert passes == [] and (out / "eval" / "sweep.json").read_bytes() == before
    assert cli.main([*evaluate_cmd, "--hold-groups", "0.5", "--fresh"]) == 0 and len(passes) == 9
    # a damaged folder is refused too, never half-read; --fresh replaces it
    (out / "eval" / "sweep.json").write_text('{"format_version": 3, "model": ')
    passes[:] = []
    capsys.readouterr()
    assert cli.main(evaluate_cmd) == 2
    assert passes == [] and "is not a results file of inactive-heads" in capsys.readouterr().err
    assert cli.main([*evaluate_cmd, "--fresh"]) == 0 and len(passes) == 7
    assert records() == resumed_records
    capsys.readouterr()

    # one writer at a time: an eval or a fit on a folder another eval holds stops before loading anything
    from inactive_heads.core.lock import FolderLock

    before = (out / "eval" / "sweep.json").read_bytes()
    passes[:] = []
    with FolderLock(out, work="predict eval"):
        assert cli.main(evaluate_cmd) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by another predict eval (pid {os.getpid()} on" in err[0]
        assert cli.main(["predict", "fit", "--model", "tiny", "--task", "mmlu", "--threshold", str(TAU),
                         "--limit", "12", "--out", str(out)]) == 2
        assert "is in use by another predict eval" in capsys.readouterr().err
    assert passes == [] and (out / "eval" / "sweep.json").read_bytes() == before
    assert not (out / ".lock").exists() and not (out / "eval" / ".lock").exists()  # the evals above left none


def test_the_static_set_breaks_a_tie_in_flag_counts_by_the_mean_score(tiny):
    """A tie built by hand: (0, 1), (1, 3) and (2, 4) are each flagged on both fit inputs, and the
    held-out realized fraction asks for 2 heads. static_heads' rule takes the lower mean ahon_ln
    score first: (2, 4) (mean 0.1), then (1, 3) (0.2); not (0, 1) (0.3), which the (layer, head)
    order alone would take first. From the fit's saved counts and means, the same set."""
    from inactive_heads.prediction.heldout import static_set
    from inactive_heads.prediction.oracle import OracleData

    L, H = tiny.cfg.n_layers, tiny.cfg.n_heads
    flags = torch.zeros(4, L, H, dtype=torch.bool)
    scores = torch.ones(4, L, H)
    for layer, head, mean in [(0, 1, 0.3), (1, 3, 0.2), (2, 4, 0.1)]:
        flags[:2, layer, head] = True
        scores[:2, layer, head] = mean
    flags[2:, 0, :2] = True  # held out: 4 of 2 x 18 flags, a realized fraction of 2 heads in 18
    data = OracleData(torch.zeros(4, L, 8), flags, ["a", "b", "c", "d"], [5, 5, 5, 5], None, scores)
    keep = [False, False, True, True]
    here, heads = static_set(tiny, data, keep, "ahon_ln", None, in_plan=2, n_fit=2)
    assert heads == [(2, 4), (1, 3)] and here["heads"] == [[2, 4], [1, 3]]
    assert here["ranked_by"] == "this plan's fit questions"
    saved = {"oracle_flag_counts": flags[:2].sum(dim=0).tolist(), "oracle_score_means": scores[:2].mean(dim=0).tolist()}
    from_fit, heads = static_set(tiny, data, keep, "ahon_ln", saved, in_plan=0, n_fit=2)
    assert heads == [(2, 4), (1, 3)] and from_fit["ranked_by"] == "the fit's saved counts"
    del saved["oracle_score_means"]  # a fit saved before the means were: ties by (layer, head), said so
    older, heads = static_set(tiny, data, keep, "ahon_ln", saved, in_plan=0, n_fit=2)
    assert heads == [(0, 1), (1, 3)] and older["ranked_by"] == "the fit's saved counts (ties by layer and head)"
