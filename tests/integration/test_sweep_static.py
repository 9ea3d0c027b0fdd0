"""Static runs in a sweep on real SmolLM2 + PIQA: sets chosen on calibration questions only, their
size and realized fraction by hand count, static and dynamic side by side in the table and report."""

import json

import pytest
import torch

import inactive_heads as ih
from inactive_heads.reporting.report import write_report
from inactive_heads.sweep.run import run_sweep
from inactive_heads.sweep.config import SweepConfig

LIMIT, CALIBRATION = 8, [100, 110]


@pytest.fixture(scope="module")
def results(smollm2, tmp_path_factory):
    config = SweepConfig(model="smollm2-135m", task="piqa", limit=LIMIT, scores=["ahon_ln", "awft"],
                         quantiles=[0.0, 0.1], batch_size=8, include_random=False, static_rule="flag_rate",
                         static_calibration=CALIBRATION)
    return run_sweep(config, tmp_path_factory.mktemp("static"), model=smollm2, progress=False)


def test_static_runs_zero_their_set_of_27_heads(results):
    for key in ("ahon_ln", "awft"):
        rec = results.records[f"{key}@static@p=0.1"]
        assert len(rec.static_heads) == 27  # round(0.1 x 30 layers x 9 heads)
        assert rec.realized_fraction == pytest.approx(27 / 270, abs=1e-12)  # every sequence, the same 27
        assert rec.label == f"{ih.get_score(key).label}, static"
        assert rec.ablation["kind"] == "static" and rec.n == LIMIT
        assert rec.oracle_savings["query_heads_pct"] == pytest.approx(10.0, abs=1e-9)  # 27 of 270 heads
        # SmolLM2: 3 KV heads of 3 query heads each per layer; a KV head goes when its 3 query heads do.
        groups = {}
        for layer, head in rec.static_heads:
            groups.setdefault((layer, head // 3), []).append(head)
        whole = sum(len(g) == 3 for g in groups.values())
        assert rec.oracle_savings["kv_heads_pct"] == pytest.approx(100 * whole / 90, abs=1e-9)
    assert "ahon_ln@static@p=0.0" not in results.records  # p = 0 is no set


def test_the_sets_are_chosen_on_the_calibration_questions_only(results, smollm2):
    stored = ih.HeadScores.load(results.path / "static_scores.safetensors")
    assert stored.n_sequences == 2 * (CALIBRATION[1] - CALIBRATION[0])  # PIQA: one sequence per choice
    # The inputs of questions 100..109 by their doc ids, scored anew: the same values.
    plan = ih.plan_evaluation(smollm2, "piqa", limit=CALIBRATION[1])
    inputs = [x for x, t in zip(plan.inputs, plan.targets) if plan.requests[t[0][0]].doc_id >= CALIBRATION[0]]
    mine = ih.record_scores(smollm2, inputs, ["awft"], progress=False)["awft"]
    assert torch.allclose(torch.sort(mine.flatten()).values, torch.sort(stored["awft"].flatten()).values, atol=1e-5)
    sets = json.loads((results.path / "static_heads.json").read_text())
    assert ih.HeadSet.from_dict(sets["awft@static@p=0.1"]).heads == tuple(
        tuple(h) for h in results.records["awft@static@p=0.1"].static_heads)


def test_static_and_dynamic_side_by_side(results):
    table = results.table()
    assert {"ahon_ln", "ahon_ln@static", "awft", "awft@static"} <= set(table["score"])
    row = table.set_index("score").loc["ahon_ln@static"]
    assert row["max_pct_within_low"] <= row["max_pct_within"] <= row["max_pct_within_high"]
    html = write_report(results.path).read_text()
    assert "AHON (LN), static" in html
    assert 'id="savings-table"' in html
