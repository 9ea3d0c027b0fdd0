"""benchmarks/gpu_check.py runs end to end on the CPU (tiny sizes) and its agreement figure is right."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key, swap", [("ahon_ln", (5, 50)), ("awft", (95, 40))])
def test_flag_agreement_counts_by_hand(key, swap):
    # Same 100 values in both, two of them swapped across the flag boundary: the p=10% thresholds
    # are equal, exactly the two swapped triples disagree, and the flagged sets share k-1 of k.
    a = torch.arange(100.0).reshape(100, 1, 1)
    b = a.clone()
    i, j = swap
    b[i], b[j] = a[j], a[i]
    got = _module().flag_agreement(a, b, key, 0.10)
    k = got["flagged_a"]
    assert 5 < k < 50 and got["flagged_b"] == k
    assert got["agreement"] == pytest.approx(98 / 100)
    assert got["iou"] == pytest.approx((k - 1) / (k + 1), abs=1e-5)
    assert got["n_triples"] == 100


def test_gpu_check_runs_on_cpu_and_prints_one_json_line():
    cmd = [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32",
           "--n", "2", "--eval-n", "2", "--batch-size", "2", "--subjects", "anatomy", "--limit", "2",
           "--num-fewshot", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert (summary["device"], summary["dtype"], summary["compared"]) == ("cpu", "float32", "bfloat16 vs float32")
    assert summary["n_prompts"] == 2 and summary["eval_n"] == 2
    assert summary["record_tokens_per_s"] > 0 and summary["peak_memory_mb"] > 100
    # N = 2 x 30 x 9 = 540 pooled values (SmolLM2: 30 layers x 9 heads); p = 10 % puts τ at the CDF's x
    # at exactly 54/N, the 54th smallest value. ahon_ln flags values below τ: at most 53 of them, exactly
    # 53 without ties at τ; awft flags above τ = the 486th smallest: at most 54, exactly 54 without ties.
    # float32 scores have no ties there (run b); bfloat16 (run a) may tie some values with τ.
    for key, k in (("ahon_ln", 53), ("awft", 54)):
        got = summary["flag_agreement"][key]
        assert got["n_triples"] == 540
        assert got["flagged_b"] == k, (key, got)
        assert 0 < got["flagged_a"] <= k, (key, got)
        # The same two flag sets give both figures: N (1 - agreement) triples are flagged in one run
        # only, so the runs share (ka + kb - differing) / 2 flags, and IoU = shared / (ka + kb - shared).
        ka, kb = got["flagged_a"], got["flagged_b"]
        differing = round(540 * (1 - got["agreement"]))
        shared = (ka + kb - differing) / 2
        assert shared == int(shared) and 0 <= shared <= min(ka, kb), (key, got)
        assert got["iou"] == pytest.approx(shared / (ka + kb - shared), abs=1e-5), (key, got)
    assert 0 < summary["realized_fraction"] < 0.5


def test_gpu_check_refuses_a_missing_device_in_one_line():
    cmd = [sys.executable, str(SCRIPT), "--device", "cuda:7", "--n", "2", "--eval-n", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "cuda:7" in last and ("not available" in last or "does not exist" in last)


def test_paper_row_runs_on_cpu_and_projects_the_grid(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32",
           "--paper-row", "--subjects", "anatomy", "--limit", "2", "--num-fewshot", "0", "--batch-size", "2",
           "--grid-subjects", "anatomy", "--grid-limit", "2", "--out", str(tmp_path / "row")]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    runs = {r["run"]: r for r in summary["runs"]}
    # the baseline and AHON (LN), AWFT at p = 0, .05, ..., .30
    assert set(runs) == {"baseline"} | {f"{k}@p={p!r}" for k in ("ahon_ln", "awft")
                                        for p in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)}
    for r in runs.values():
        assert r["n"] == 2 and r["low"] <= r["accuracy_pct"] <= r["high"] and r["tau_paper"] is None
    assert summary["paper_model"] is None and summary["paper_accuracies"] is None  # SmolLM2 is not a paper model
    assert summary["questions_per_s"] > 0
    # The paper's grid: baseline + (13 scores and Random) x 7 p; the 14 runs at p = 0 reuse the baseline
    assert summary["grid_runs"] == 1 + 14 * 7
    assert summary["grid_estimate"]["projection"]["passes"] == {"baseline": 1, "records_scores": True,
                                                                 "ablated": 14 * 6, "reused": 14}
    assert "questions/s" in out.stdout and "tau paper" in out.stdout


def test_paper_thresholds_are_the_released_ones():
    module = _module()
    from types import SimpleNamespace

    from inactive_heads.scoring.scores import OFFICIAL_NAMES

    args = SimpleNamespace(model="/models/Llama-3.1-8B/", paper_model=None)
    assert module.paper_model(args) == "meta-llama_Llama-3.1-8B"
    assert module.paper_model(SimpleNamespace(model="/models/my-model", paper_model=None)) is None
    from inactive_heads.scoring.calibration import official_thresholds

    released = json.loads((SCRIPT.parents[1] / "inactive_heads" / "data" / "official_thresholds.json").read_text())
    paper = {k: official_thresholds("meta-llama_Llama-3.1-8B", "mmlu", k) for k in ("ahon_ln", "awft")}
    record = {"score": "awft", "p": 0.1, "correct": [True, False], "realized_percent": 3.0, "threshold": 0.5, "n": 2}
    _, rows = module.paper_row_lines({"awft@p=0.1": record}, paper)
    # p = 0.10 is the third of the released p = 0, .05, .10, ...
    assert rows[0]["tau_paper"] == released["mmlu"]["meta-llama_Llama-3.1-8B"][OFFICIAL_NAMES["awft"]][2]
    assert rows[0]["accuracy_pct"] == 50.0
