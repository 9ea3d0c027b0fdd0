"""The grid file and the cross-model table (synthetic sweep folders: no model needed)."""

import json

import pandas as pd
import pytest
from synthetic_sweep import write_synthetic_sweep

from inactive_heads.cli import main
from inactive_heads.sweep.grid import GridConfig, compare_table
from inactive_heads.reporting.report import summary_table
from inactive_heads.sweep.results import SweepResults


def two_models(tmp_path):
    a = write_synthetic_sweep(tmp_path / "a", baseline=50.0)
    b = write_synthetic_sweep(tmp_path / "b", baseline=60.0)
    cfg = json.loads((b / "sweep.json").read_text())
    cfg["model"] = "toy-model-b"
    (b / "sweep.json").write_text(json.dumps(cfg))
    return a, b


def test_compare_table_agrees_with_each_folders_summary(tmp_path):
    folders = two_models(tmp_path)
    table = compare_table(folders)
    assert list(table["model"]) == ["toy-model", "toy-model-b"]
    for folder, row in zip(folders, table.itertuples(index=False)):
        results = SweepResults.load(folder)
        own = summary_table(results).set_index("score")  # the single-sweep table: another code path
        assert row.baseline_pct == pytest.approx(results.records["baseline"].accuracy_percent)
        assert row.baseline_low <= row.baseline_pct <= row.baseline_high
        assert row.awft_max_pct == pytest.approx(own.loc["awft", "max_pct_within"])
        others = own.drop(index="awft")["max_pct_within"]
        assert row.best_other_max_pct == pytest.approx(others.max())
        assert row.best_other == others.idxmax()
        for key in own.index:
            assert getattr(row, f"rank_{key}") == own.loc[key, "rank"]


def test_report_compare_writes_markdown_csv_html(tmp_path, capsys):
    a, b = two_models(tmp_path)
    assert main(["report", "--compare", str(a), str(b), "--compare-out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "| toy-model | mmlu |" in printed and "| toy-model-b | mmlu |" in printed
    csv = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(csv["model"]) == ["toy-model", "toy-model-b"]
    assert "<table" in (tmp_path / "cmp" / "compare.html").read_text()


def test_grid_file_is_checked_before_anything_runs(tmp_path):
    good = tmp_path / "grid.toml"
    good.write_text('models = ["smollm2-135m"]\ntasks = ["mmlu"]\nout = "res"\n'
                    '[sweep]\nsubjects = ["anatomy"]\nlimit = 2\nscores = ["awft"]\nquantiles = [0.1, 0.3]\n')
    grid = GridConfig.load(good)
    assert grid.folder("smollm2-135m", "mmlu") == tmp_path / "res" / "smollm2-135m__mmlu"
    assert grid.sweep_config("smollm2-135m", "mmlu").quantiles == [0.1, 0.3]
    bad = tmp_path / "bad.toml"
    bad.write_text('models = ["smollm2-135m"]\n[sweep]\nlimit = 0\n')
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        GridConfig.load(bad)
    bad.write_text('models = ["smollm2-135m"]\nexecutor = "dask"\n')
    with pytest.raises(ValueError, match="unknown executor 'dask'"):
        GridConfig.load(bad)
    bad.write_text('models = ["smollm2-135m"]\nmodel = "x"\n')
    with pytest.raises(ValueError, match="unknown grid key 'model'"):
        GridConfig.load(bad)


def test_sweep_cli_refuses_ray_options_without_ray_and_a_locked_folder(tmp_path, capsys):
    import os

    from inactive_heads.core.lock import FolderLock

    assert main(["sweep", "--out", str(tmp_path / "x"), "--workers", "2", "--scores", "awft"]) == 2
    assert "need --executor ray" in capsys.readouterr().err
    with FolderLock(tmp_path / "busy"):
        code = main(["sweep", "--out", str(tmp_path / "busy"), "--scores", "awft", "--limit", "1",
                     "--subjects", "anatomy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"in use by another sweep (pid {os.getpid()}" in err[0]


def test_generation_options_reach_the_gsm8k_cells_only_and_static_options_every_cell():
    grid = GridConfig(models=["smollm2-135m"], tasks=["piqa", "gsm8k"],
                      sweep={"limit": 20, "decision": "prompt", "max_gen_toks": 64})
    piqa, gsm8k = grid.sweep_config("smollm2-135m", "piqa"), grid.sweep_config("smollm2-135m", "gsm8k")
    assert (piqa.decision, piqa.max_gen_toks) == (None, None)
    assert (gsm8k.decision, gsm8k.max_gen_toks) == ("prompt", 64)
    static = GridConfig(models=["smollm2-135m"], tasks=["piqa", "winogrande"],
                        sweep={"limit": 20, "static_rule": "mean", "static_calibration": [100, 150]})
    assert all(static.sweep_config("smollm2-135m", t).static_keys for t in static.tasks)
