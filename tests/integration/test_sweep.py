"""The sweep on real SmolLM2 + real MMLU (tiny subset): records, resume after interruption, config checks."""

import importlib
import json

import pytest
from inactive_heads.sweep import SweepConfig, SweepResults, run_sweep

# The submodule itself: ``inactive_heads.evaluate`` as an attribute is the exported function.
evaluate_module = importlib.import_module("inactive_heads.evaluate")
VOLATILE = ("seconds", "finished_at")


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
    return {k: {f: v for f, v in r.items() if f not in VOLATILE} for k, r in records.items()}


@pytest.fixture(scope="module")
def complete(smollm2_hooked, tmp_path_factory):
    out = tmp_path_factory.mktemp("complete")
    return run_sweep(small_config(), out, model=smollm2_hooked, progress=False)


def test_complete_sweep_has_every_run(complete):
    assert complete.is_complete
    assert set(complete.records) == {r for r, _, _ in small_config().run_ids()}
    assert len(complete.records) == 1 + 3 * 2
    curves = complete.curves()
    assert set(curves) == {"ahon_ln", "awft", "random"}
    base = complete.records["baseline"]
    assert base["n"] == 6 and base["realized_fraction"] == 0.0
    # p = 0 calibrates tau at the pooled minimum (maximum for AWFT): nothing is zeroed, so the
    # run reproduces the baseline exactly.
    for key in ("ahon_ln", "awft", "random"):
        rec = complete.records[f"{key}@p=0.00"]
        assert rec["realized_fraction"] == 0.0
        assert rec["correct"] == base["correct"]
    assert complete.records["ahon_ln@p=0.30"]["realized_fraction"] > 0
    thresholds = json.loads((complete.path / "thresholds.json").read_text())
    assert set(thresholds) == {"ahon_ln", "awft", "random"}
    table = complete.table()
    assert list(table["score"]).count("ahon_ln") == 1 and list(table["rank"]) == [1, 2, 3]


def test_interrupted_sweep_resumes_without_redoing_finished_runs(smollm2_hooked, complete, tmp_path, monkeypatch):
    real = evaluate_module.evaluate
    calls = []

    def interrupt_after_three(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(kwargs.get("ablation"))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_config(), tmp_path, model=smollm2_hooked, progress=False)
    finished = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert len(finished) == 3
    assert not list((tmp_path / "runs").glob(".*.tmp"))  # nothing half-written
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}

    resumed_calls = []

    def counting(*args, **kwargs):
        resumed_calls.append(kwargs.get("ablation"))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", counting)
    resumed = run_sweep(small_config(), tmp_path, model=smollm2_hooked, progress=False)
    assert len(resumed_calls) == len(complete.records) - 3
    for name, mtime in mtimes.items():  # finished runs were not rewritten
        assert (tmp_path / "runs" / name).stat().st_mtime_ns == mtime
    assert stable(resumed.records) == stable(complete.records)
    assert stable(SweepResults.load(tmp_path).records) == stable(complete.records)


def test_a_different_sweep_in_the_same_folder_is_refused(complete, smollm2_hooked):
    with pytest.raises(ValueError, match="holds a different sweep \\(differs in limit\\)"):
        run_sweep(small_config(limit=4), complete.path, model=smollm2_hooked, progress=False)


def test_config_round_trips_and_validates():
    cfg = small_config()
    assert SweepConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown task 'mmlu2'"):
        small_config(task="mmlu2")
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        small_config(limit=0)
    with pytest.raises(KeyError, match="unknown score 'ahon_ln2'"):
        small_config(scores=["ahon_ln2"])
    with pytest.raises(ValueError, match="quantiles"):
        small_config(quantiles=[1.5])
    with pytest.raises(ValueError, match="unknown sweep option"):
        SweepConfig.from_dict({"modle": "x"})
