"""The sweep on real SmolLM2 + real MMLU (tiny subset): records, resume after interruption, config checks."""

import importlib
import json

import pytest
import torch
from inactive_heads.sweep.run import run_sweep
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.results import SweepResults

# The submodule itself: ``inactive_heads.evaluation.evaluator`` as an attribute is the exported function.
evaluate_module = importlib.import_module("inactive_heads.evaluation.evaluator")


def small_config(**overrides):
    base = dict(
        model="smollm2-135m",
        task="mmlu",
        subjects=["abstract_algebra", "anatomy"],
        limit=3,
        num_fewshot=0,
        scores=["ahon_ln", "awft"],
        quantiles=[0.0, 0.3],
        batch_size=4,
    )
    base.update(overrides)
    return SweepConfig(**base)


def stable(records):
    return {k: r.without_volatile() for k, r in records.items()}


@pytest.fixture(scope="module")
def complete(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("complete")
    return run_sweep(small_config(), out, model=smollm2, progress=False)


def test_complete_sweep_has_every_run(complete):
    assert complete.is_complete
    assert set(complete.records) == {r for r, _, _ in small_config().run_ids()}
    assert len(complete.records) == 1 + 3 * 2
    curves = complete.curves()
    assert set(curves) == {"ahon_ln", "awft", "random"}
    base = complete.records["baseline"]
    assert base.n == 6 and base.realized_fraction == 0.0
    assert len(base.loglikelihoods) == 6 and all(len(ll) == 4 for ll in base.loglikelihoods)
    chosen = [max(range(4), key=ll.__getitem__) for ll in base.loglikelihoods]
    assert base.correct == [c == g for c, g in zip(chosen, base.gold)]
    assert base.subjects == ["abstract_algebra"] * 3 + ["anatomy"] * 3
    for key in ("ahon_ln", "awft", "random"):
        assert complete.records[f"{key}@p=0.0"].reused_from == "baseline"
    assert complete.records["ahon_ln@p=0.3"].realized_fraction > 0
    thresholds = json.loads((complete.path / "thresholds.json").read_text())
    assert set(thresholds) == {"ahon_ln", "awft", "random"}
    table = complete.table()
    assert list(table["score"]).count("ahon_ln") == 1


def test_reused_p0_records_equal_a_real_evaluation(complete, smollm2):
    """p = 0 is not evaluated in the sweep; evaluating it for real gives the same record."""
    plan = evaluate_module.plan_evaluation(smollm2, "mmlu", subjects=["abstract_algebra", "anatomy"],
                                           limit=3, num_fewshot=0)
    for key in ("ahon_ln", "awft", "random"):
        rec = complete.records[f"{key}@p=0.0"]
        real = evaluate_module.evaluate(smollm2, plan, ablation=rec.ablation, batch_size=4,
                                        progress=False)
        assert real.realized_fraction == 0.0 and real.realized_fraction_per_layer == [0.0] * 30
        assert real.loglikelihoods == rec.loglikelihoods  # bit for bit
        assert real.correct == rec.correct and real.accuracy == rec.accuracy


def test_scores_come_from_the_baseline_pass(complete, smollm2):
    """One unablated pass: the scores it records equal a separate record_scores pass."""
    from inactive_heads.scoring.recording import record_scores

    plan = evaluate_module.plan_evaluation(smollm2, "mmlu", subjects=["abstract_algebra", "anatomy"],
                                           limit=3, num_fewshot=0)
    separate = record_scores(smollm2, plan.inputs, ["ahon_ln", "awft"], batch_size=4, progress=False)
    stored = complete.head_scores()
    assert complete.scores_path.name == "scores.safetensors"
    for key in ("ahon_ln", "awft"):
        assert torch.equal(stored[key], separate[key])


def test_interrupted_sweep_resumes_without_redoing_finished_runs(smollm2, complete, tmp_path, monkeypatch):
    real = evaluate_module.evaluate
    calls = []

    def interrupt_after_three(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(kwargs.get("ablation"))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_config(), tmp_path, model=smollm2, progress=False)
    # the unablated pass (baseline + scores) ran once, first; the three p = 0 runs reuse it
    assert calls[0] is None and all(c is not None and c.threshold > 0 for c in calls[1:])
    finished = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert len(finished) == 1 + 3 + 2
    assert not list((tmp_path / "runs").glob(".*.tmp"))  # nothing half-written
    assert not (tmp_path / ".lock").exists()  # released on the way out
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}

    resumed_calls = []

    def counting(*args, **kwargs):
        resumed_calls.append(kwargs.get("ablation"))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", counting)
    resumed = run_sweep(small_config(), tmp_path, model=smollm2, progress=False)
    assert len(resumed_calls) == 1  # only the run that was interrupted
    for name, mtime in mtimes.items():  # finished runs were not rewritten
        assert (tmp_path / "runs" / name).stat().st_mtime_ns == mtime
    assert stable(resumed.records) == stable(complete.records)
    assert stable(SweepResults.load(tmp_path).records) == stable(complete.records)


def test_results_as_dataframes(complete):
    import pandas as pd

    import inactive_heads as ih

    runs = pd.read_parquet(complete.path / "runs.parquet")
    assert len(runs) == 7 and set(runs["run_id"]) == set(complete.records)
    assert runs.set_index("run_id").loc["ahon_ln@p=0.3", "accuracy_percent"] == \
        complete.records["ahon_ln@p=0.3"].accuracy_percent
    questions = ih.load_results(complete.path, "questions")
    assert len(questions) == 7 * 6
    base = questions[questions["run_id"] == "baseline"]
    assert list(base["doc_id"]) == complete.records["baseline"].doc_ids
    assert list(base["correct"]) == complete.records["baseline"].correct
    assert pd.read_parquet(complete.path / "questions.parquet")["loglikelihoods"].map(list).tolist() == \
        questions["loglikelihoods"].tolist()


def test_a_different_sweep_in_the_same_folder_is_refused(complete, smollm2):
    with pytest.raises(ValueError, match="holds a different sweep \\(differs in limit\\)"):
        run_sweep(small_config(limit=4), complete.path, model=smollm2, progress=False)


def test_config_round_trips_and_validates(tmp_path):
    cfg = small_config().validate()
    assert SweepConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown task 'mmlu2'"):
        small_config(task="mmlu2").validate()
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        small_config(limit=0).validate()
    with pytest.raises(KeyError, match="unknown score 'ahon_ln2'"):
        small_config(scores=["ahon_ln2"]).validate()
    with pytest.raises(ValueError, match="quantiles"):
        small_config(quantiles=[1.5]).validate()
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):  # run_sweep validates,
        run_sweep(small_config(limit=0), tmp_path / "never-written", progress=False)
    assert not (tmp_path / "never-written").exists()  # before it touches the folder
    with pytest.raises(ValueError, match="unknown sweep option"):
        SweepConfig.from_dict({"modle": "x"})


def test_run_ids_are_unique_for_close_quantiles():
    cfg = small_config(quantiles=[0.001, 0.004, 0.3])
    ids = [r for r, _, _ in cfg.run_ids()]
    assert len(ids) == len(set(ids)) == 1 + 3 * 3
    assert "awft@p=0.001" in ids and "awft@p=0.004" in ids
    with pytest.raises(ValueError, match="quantiles must be distinct"):
        small_config(quantiles=[0.1, 0.1]).validate()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--thresholds", "official:nosuchmodel"], "no official thresholds for model 'nosuchmodel' on mmlu"),
        (["--thresholds", "official:meta-llama/Llama-3.2-3B", "--quantiles", "0", "0.33"],
         "no official threshold at p=0.33 for 'ahon_ln' of meta-llama/Llama-3.2-3B"),
    ],
)
def test_official_thresholds_are_checked_before_any_loading(monkeypatch, tmp_path, capsys, options, message):
    """``inactive-heads sweep`` with bad official thresholds: one line, exit 2, no model loaded, no folder."""
    import inactive_heads.models.loading as models
    from inactive_heads.cli import main

    loads = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(a))  # what run_sweep calls
    out = tmp_path / "sweep"
    code = main(["sweep", "--model", "smollm2-135m", "--subjects", "anatomy", "--limit", "2",
                 "--scores", "ahon_ln", "--out", str(out), *options])
    err = capsys.readouterr().err
    assert (code, loads, out.exists()) == (2, [], False)
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_second_driver_on_the_same_folder_refuses(tmp_path):
    import os
    import subprocess
    import sys

    from inactive_heads.core.lock import FolderLock

    with FolderLock(tmp_path):
        with pytest.raises(RuntimeError, match=f"in use by another sweep \\(pid {os.getpid()} on"):
            with FolderLock(tmp_path):
                pass
    assert not (tmp_path / ".lock").exists()
    # a lock left by a process that is gone (same host) is taken over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "since": "x"}))
    with FolderLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_sweep_with_prefix_reuse_equals_full_recompute(smollm2, tmp_path):
    """The same sweep with each subject's 2-shot prefix reused: identical answers and realized
    fractions per layer in every run, thresholds and log-likelihoods within float rounding."""
    options = dict(num_fewshot=2, quantiles=[0.0, 0.3], include_random=False, scores=["ahon_ln"])
    full = run_sweep(small_config(**options), tmp_path / "full", model=smollm2, progress=False)
    reused = run_sweep(small_config(reuse_prefix=True, **options), tmp_path / "reused", model=smollm2,
                       progress=False)
    assert set(full.records) == set(reused.records)
    for rid, a in full.records.items():
        b = reused.records[rid]
        assert a.correct == b.correct, rid
        assert a.realized_fraction_per_layer == b.realized_fraction_per_layer, rid
        worst = max(abs(x - y) for la, lb in zip(a.loglikelihoods, b.loglikelihoods) for x, y in zip(la, lb))
        assert worst <= 1e-4, (rid, worst)
    assert reused.records["ahon_ln@p=0.3"].realized_fraction > 0
    for key in options["scores"]:
        for q in options["quantiles"]:
            assert reused.thresholds[key].at(q) == pytest.approx(full.thresholds[key].at(q), rel=1e-5, abs=1e-6)


def test_a_resume_may_change_the_batch_size(complete, smollm2, tmp_path):
    """The batch size is not part of a sweep's identity: runs left over are evaluated at another
    batch size and their records equal those of the complete sweep (batch size 4): answers and
    realized fractions exactly, log-likelihoods within fp32 rounding (here, measured: to the bit)."""
    import shutil

    folder = tmp_path / "sweep"
    shutil.copytree(complete.path, folder)
    redo = ("ahon_ln@p=0.3", "random@p=0.3")
    for rid in redo:
        (folder / "runs" / f"{rid}.json").unlink()
    resumed = run_sweep(small_config(batch_size=3), folder, model=smollm2, progress=False)
    assert json.loads((folder / "sweep.json").read_text())["batch_size"] == 3
    for rid, rec in resumed.records.items():
        assert rec.batch_size == (3 if rid in redo else 4), rid
        assert rec.torch_threads >= 1
    without = ("batch_size", "torch_threads", "loglikelihoods")
    assert {k: {f: v for f, v in r.items() if f not in without} for k, r in stable(resumed.records).items()} == \
        {k: {f: v for f, v in r.items() if f not in without} for k, r in stable(complete.records).items()}
    for rid in redo:
        for a, b in zip(resumed.records[rid].loglikelihoods, complete.records[rid].loglikelihoods):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-5), rid


@pytest.mark.slow  # three CLI runs, each loading SmolLM2
def test_cli_sweep_json_holds_the_resolved_dtype_and_a_resume_keeps_it(tmp_path, capsys):
    """``--dtype auto`` (the default) is written as the dtype the model computes in; a resume in
    another dtype is refused in one line; one with another ``--batch-size`` goes on."""
    from inactive_heads.cli import main

    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "smollm2-135m", "--task", "piqa", "--limit", "2", "--scores", "ahon_ln",
            "--quantiles", "0", "0.3", "--no-random", "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 0
    stored = json.loads((out / "sweep.json").read_text())
    assert (stored["dtype"], stored["device"]) == ("float32", "cpu")
    first = json.loads((out / "runs" / "ahon_ln@p=0.3.json").read_text())
    capsys.readouterr()

    assert main(argv + ["--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "computed in float32 on cpu, this run would compute in bfloat16" in err and "--dtype float32" in err

    (out / "runs" / "ahon_ln@p=0.3.json").unlink()
    assert main(argv + ["--batch-size", "1"]) == 0
    again = json.loads((out / "runs" / "ahon_ln@p=0.3.json").read_text())
    assert again["batch_size"] == 1 and first["batch_size"] == 2
    for field in ("correct", "realized_fraction_per_layer", "threshold", "dtype", "device"):
        assert again[field] == first[field], field
    # padding differs between batch sizes 1 and 2: fp32 sums within rounding (measured: 1.1e-5 on -73.19)
    for a, b in zip(again["loglikelihoods"], first["loglikelihoods"]):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)
