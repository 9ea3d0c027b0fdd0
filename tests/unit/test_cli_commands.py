"""The CLI's analysis commands on synthetic data, and its one-line errors for bad options."""

import json

import pytest
from synthetic_sweep import synthetic_head_scores, write_synthetic_sweep

from inactive_heads.cli import main
from inactive_heads.sweep.results import SweepResults


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_prints_and_writes_thresholds(tmp_path, capsys):
    hs = synthetic_head_scores()
    path = hs.save(tmp_path / "scores.pt")
    code, out, _ = run(capsys, "calibrate", str(path), "--quantiles", "0", "0.1", "--out", str(tmp_path / "t.json"))
    assert code == 0
    for key in hs.keys():
        assert key in out
    saved = json.loads((tmp_path / "t.json").read_text())
    assert set(saved) == set(hs.keys())
    assert saved["ahon_ln"]["values"][0] == pytest.approx(float(hs["ahon_ln"].min()))
    assert saved["awft"]["values"][0] == pytest.approx(float(hs["awft"].max()))  # "above" score


def test_report_command_writes_html_and_prints_the_table(tmp_path, capsys):
    write_synthetic_sweep(tmp_path)
    code, out, _ = run(capsys, "report", str(tmp_path))
    assert code == 0
    assert "AHON (LN)" in out and "report:" in out
    assert (tmp_path / "report.html").is_file()
    # --runs adds one row per run: 1 + 4 scores x 7 p values
    _, with_runs, _ = run(capsys, "report", str(tmp_path), "--runs")
    run_ids = set(SweepResults.load(tmp_path).records)
    rows = [line.split()[0] for line in with_runs.splitlines()
            if line.split() and line.split()[0] in run_ids and line.split()[1] != "accuracy"]
    assert sorted(rows) == sorted(run_ids) and len(rows) == 29


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "--out", "x", "--limit", "0"], "argument --limit: expected a positive integer, got 0"),
        (["sweep", "--out", "x", "--task", "mmlu2"], "invalid choice: 'mmlu2'"),
        (["sweep", "--out", "x", "--quantiles", "1.5"], "quantiles must be in [0, 1), got 1.5"),
        (["sweep", "--out", "x", "--dtype", "float8"], "invalid choice: 'float8'"),
        (["sweep"], "the following arguments are required: --out"),
    ],
)
def test_bad_options_give_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.strip().splitlines()[-1].startswith("inactive-heads")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "--out", "x", "--scores", "ahon_ln2"], "unknown score 'ahon_ln2'; known: awft"),
        (["sweep", "--out", "x", "--subjects", "anatomyy"], "unknown MMLU subject 'anatomyy'"),
        (["sweep", "--out", "x", "--task", "piqa", "--subjects", "anatomy"], "subjects= applies to mmlu only, not to task 'piqa'"),
        (["sweep", "--out", "x", "--thresholds", "mine"], "thresholds must be 'calibrated' or 'official:<model>'"),
        (["report", "/nonexistent/folder"], "is not a sweep results folder"),
        (["calibrate", "/nonexistent/scores.pt"], "no head scores at"),
    ],
)
def test_bad_values_give_one_line_before_any_model_loads(monkeypatch, tmp_path, capsys, argv, message):
    import inactive_heads.cli as cli
    import inactive_heads.models.loading as loading

    monkeypatch.chdir(tmp_path)  # "--out x": a sweep that wrongly started would write here
    loads = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))  # the sweep's loader
    monkeypatch.setattr(cli.options, "load", lambda args: loads.append(args))  # score's
    code, _, err = run(capsys, *argv)
    assert loads == [] and not (tmp_path / "x").exists()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["score", "--scores", "ahon_ln2"], "unknown score 'ahon_ln2'"),
        (["score", "--subjects", "anatomyy"], "unknown MMLU subject 'anatomyy'"),
        (["score", "--text-file", "/nonexistent/passages.txt"], "/nonexistent/passages.txt"),
    ],
)
def test_score_checks_its_inputs_before_loading_the_model(monkeypatch, capsys, argv, message):
    import inactive_heads.cli as cli

    def spy(args):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(cli.options, "load", spy)
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback(capsys):
    # Without --debug one line; with it the library's exception itself propagates.
    assert run(capsys, "report", "/nonexistent/folder")[0] == 2
    with pytest.raises(FileNotFoundError, match="is not a sweep results folder"):
        main(["--debug", "report", "/nonexistent/folder"])
