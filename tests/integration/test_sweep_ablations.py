"""A sweep with a fixed ablation of a kind registered in user code (tests/integration/user_ablation.py,
reached through ``SweepConfig.imports``), on SmolLM2 + MMLU (tiny).

Expected values come from elsewhere than the sweep: ``ih.evaluate`` with the built-in
``StaticAblation`` of the same heads (the user's kind builds its mask itself), the realized
fraction counted by hand (SmolLM2-135M: 30 layers x 9 heads), and a fresh Python process that
cannot import the user's module reading the folder back.
"""

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import inactive_heads as ih
from inactive_heads.reporting.report import format_table
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.run import run_sweep

evaluate_module = importlib.import_module("inactive_heads.evaluation.evaluator")
REPO = Path(__file__).resolve().parents[2]
HEADS = [[0, 1], [4, 8], [17, 0], [29, 3]]
SPEC = {"kind": "zero_listed_heads", "heads": HEADS}


def config(**overrides):
    base = dict(model="smollm2-135m", task="mmlu", subjects=["abstract_algebra", "anatomy"], limit=3, num_fewshot=0,
                scores=["ahon_ln"], quantiles=[0.0, 0.3], batch_size=4, imports=["user_ablation"],
                ablations=[SPEC])
    base.update(overrides)
    return SweepConfig(**base)


@pytest.fixture(scope="module")
def results(smollm2, tmp_path_factory):
    return run_sweep(config(), tmp_path_factory.mktemp("custom"), model=smollm2, progress=False)


@pytest.fixture(scope="module")
def rid(results):
    (key,) = results.ablation_keys
    return key


def test_the_custom_run_equals_the_built_in_static_ablation_of_its_heads(results, rid, smollm2):
    rec = results.records[rid]
    assert rid.startswith("zero_listed_heads@")
    assert rec.ablation == SPEC and rec.score == rid and rec.p is None and rec.threshold is None
    assert rec.label == "zero_listed_heads(heads=[[0, 1], [4, 8], [17, 0], [29, 3]])"
    expected = ih.evaluate(smollm2, "mmlu", subjects=["abstract_algebra", "anatomy"], limit=3, num_fewshot=0,
                           batch_size=4, progress=False, ablation=ih.StaticAblation([tuple(h) for h in HEADS]))
    assert rec.loglikelihoods == expected.loglikelihoods
    assert rec.loglikelihoods != results.records["baseline"].loglikelihoods  # the heads matter
    assert rec.realized_fraction == pytest.approx(len(HEADS) / (30 * 9), abs=1e-12)
    # written to the folder by its spec: sweep.json keeps the list, and the spec rebuilds the kind
    assert json.loads((results.path / "sweep.json").read_text())["ablations"] == [SPEC]
    assert ih.ablation_from_spec(rec.ablation).heads == HEADS


def test_it_is_one_point_beside_the_curves(results, rid):
    assert results.score_keys == ["ahon_ln", "random"] and rid not in results.curves()
    assert rid not in set(results.table()["score"])  # no curve, so no AUC
    frame = ih.load_results(results.path).set_index("run_id")
    assert frame.loc[rid, "score"] == rid and math.isnan(frame.loc[rid, "p"])
    assert frame.loc[rid, "accuracy_percent"] == results.records[rid].accuracy_percent
    text = format_table(results)
    section = text[text.index("fixed ablations"):]
    assert rid in section and "zero_listed_heads(heads=" in section
    assert rid not in text[:text.index("fixed ablations")]  # not among the ranked scores


def test_a_resume_skips_the_finished_custom_run(results, rid, smollm2, monkeypatch):
    calls = []
    real = evaluate_module.evaluate

    def counting(*args, **kwargs):
        calls.append(kwargs.get("ablation"))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", counting)
    before = (results.path / "runs" / f"{rid}.json").stat().st_mtime_ns
    resumed = run_sweep(config(), results.path, model=smollm2, progress=False)
    assert calls == []
    assert (results.path / "runs" / f"{rid}.json").stat().st_mtime_ns == before
    assert {k: r.without_volatile() for k, r in resumed.records.items()} == \
        {k: r.without_volatile() for k, r in results.records.items()}


def test_a_machine_without_the_users_module_reads_the_folder(results, rid, tmp_path):
    script = (
        "import sys, inactive_heads as ih\n"
        "from inactive_heads.reporting.report import format_table, write_report\n"
        "try:\n    import user_ablation\nexcept ImportError:\n    pass\nelse:\n    sys.exit('importable here')\n"
        f"frame = ih.load_results({str(results.path)!r})\n"
        f"text = format_table({str(results.path)!r})\n"
        f"report = write_report({str(results.path)!r}, {str(tmp_path / 'report.html')!r})\n"
        "assert 'user_ablation' not in sys.modules\n"
        f"print(sorted(frame.run_id)); print({rid!r} in text); print(report.read_text().count({rid!r}) > 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()[-3:]
    assert lines == [str(sorted(results.records)), "True", "True"]
