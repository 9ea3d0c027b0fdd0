"""Happy paths of the CLI's model commands (score, sweep, demo) on a tiny random-weight Llama
saved with the SmolLM2 tokenizer: real PIQA prompts, a few questions, seconds per command."""

import json
import re

import pytest
from tiny import save_tiny_llama_with_smollm2_tokenizer

from inactive_heads.cli import main
from inactive_heads.scoring.recording import HeadScores
from inactive_heads.sweep.folder import RESULTS_FORMAT
from inactive_heads.sweep.results import SweepResults


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random-weight Llama saved with the SmolLM2 tokenizer: real PIQA prompts, fast passes."""
    return save_tiny_llama_with_smollm2_tokenizer(tmp_path_factory.mktemp("tiny-llama"))


def test_score_writes_the_scores_of_every_prompt(tiny_dir, tmp_path, capsys):
    out = tmp_path / "scores.pt"
    code = main(["score", "--model", tiny_dir, "--task", "piqa", "--limit", "3", "--scores", "ahon_ln", "awft",
                 "--batch-size", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    saved = next(tmp_path.iterdir())  # the file written (its suffix is the recorder's choice)
    hs = HeadScores.load(saved)
    # PIQA: one prompt per (question, choice): 3 questions x 2 solutions; the tiny Llama has 3 x 4 heads.
    assert hs.keys() == ["ahon_ln", "awft"] and hs.n_sequences == 6 and (hs.n_layers, hs.n_heads) == (3, 4)
    row = next(line for line in text.splitlines() if line.startswith("awft"))
    mean, smallest, largest = map(float, row.split()[-3:])  # columns: mean, min, max
    assert smallest <= mean <= largest and 0.0 <= smallest and largest <= 1.0  # AWFT is an attention weight


def test_sweep_and_demo_finish_with_intervals(tiny_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["sweep", "--model", tiny_dir, "--task", "piqa", "--limit", "8", "--scores", "ahon_ln",
                 "--quantiles", "0", "0.3", "--batch-size", "8", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    results = SweepResults.load(out)
    assert results.is_complete and len(results.records) == 1 + 2 * 2
    correct = results.records["baseline"].correct
    printed = float(re.search(r"baseline accuracy \(nothing zeroed\): ([\d.]+)%", text).group(1))
    assert printed == pytest.approx(100 * sum(correct) / len(correct), abs=0.005)
    assert (out / "report.html").is_file()
    # Each score's row of the ranking: three "value [low, high]" cells, each interval holding its value;
    # the normalized AUC of a two-point curve (p = 0 and 0.3) is the mean of its two accuracies, and
    # the last column is the realized % of the p = 0.3 run.
    for key, label in (("ahon_ln", "AHON (LN)"), ("random", "Random")):
        row = re.search(rf"^ *\d+  {re.escape(label)} +(.*)$", text, re.M).group(1)
        # A value or an interval end marked "≥" is a lower bound: the largest realized % (docs/report.md).
        marked = re.findall(r"(≥ )?(-?[\d.]+) \[(≥ )?(-?[\d.]+), (≥ )?(-?[\d.]+)\]", row)
        cells = [(v, lo, hi) for _, v, _, lo, _, hi in marked]
        assert len(cells) == 3 and all(float(lo) <= float(v) <= float(hi) for v, lo, hi in cells), row
        for cell in marked:
            for sign, number in zip(cell[::2], cell[1::2]):
                if sign:
                    assert float(number) == pytest.approx(float(row.split()[-1]), abs=0.05), row
        start, end = results.records[f"{key}@p=0.0"], results.records[f"{key}@p=0.3"]
        assert float(cells[1][0]) == pytest.approx((start.accuracy_percent + end.accuracy_percent) / 2,
                                                   abs=0.05), row
        assert float(row.split()[-1]) == pytest.approx(end.realized_percent, abs=0.005), row

    demo = tmp_path / "demo"
    code = main(["demo", "--model", tiny_dir, "--limit", "8", "--quantiles", "0", "0.3", "--out", str(demo)])
    text = capsys.readouterr().out
    assert code == 0
    assert "Reading (n = 8 questions, 95% intervals)" in text and (demo / "report.html").is_file()
    config = json.loads((demo / "sweep.json").read_text())
    assert config["task"] == "piqa" and config["num_fewshot"] == 0 and config["limit"] == 8
    # every run of the demo's plan has a record, with per-question log-likelihoods for agreement/KL
    records = SweepResults.load(demo).records
    assert len(records) == 1 + 3 * 2 and all(len(r.loglikelihoods) == 8 for r in records.values())
    # the folder format: in sweep.json and in every record (reused p = 0 records included)
    assert config["format_version"] == RESULTS_FORMAT and {r.format_version for r in records.values()} == {
        RESULTS_FORMAT}


def test_a_sweep_that_cannot_prompt_leaves_its_folder_empty_and_the_demo_runs_winogrande(tiny_dir, tmp_path, capsys):
    # WinoGrande 0-shot with a chat template has nothing to render: the sweep must fail before it
    # writes sweep.json, so the same folder then takes another sweep (here the demo's WinoGrande).
    out = tmp_path / "folder"
    code = main(["sweep", "--model", tiny_dir, "--task", "winogrande", "--num-fewshot", "0", "--chat", "--limit", "2",
                 "--scores", "ahon_ln", "--quantiles", "0", "--no-random", "--out", str(out)])
    assert code != 0 and "empty conversation" in capsys.readouterr().err
    assert not (out / "sweep.json").exists()
    code = main(["demo", "--model", tiny_dir, "--task", "winogrande", "--limit", "4", "--quantiles", "0", "0.3",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    config = json.loads((out / "sweep.json").read_text())
    assert config["task"] == "winogrande" and config["num_fewshot"] == 1
    assert "1-shot" in text and "Reading (n = 4 questions, 95% intervals)" in text


def test_sweep_runs_a_users_registered_kind_given_by_import_and_ablation(tiny_dir, tmp_path, capsys):
    # tests/integration/user_ablation.py registers "zero_listed_heads"; its heads and the built-in
    # static text form of the same heads must zero the same and give the same log-likelihoods.
    out = tmp_path / "sweep"
    spec = {"kind": "zero_listed_heads", "heads": [[0, 1], [2, 3]]}
    code = main(["sweep", "--model", tiny_dir, "--task", "piqa", "--limit", "6", "--scores", "ahon_ln",
                 "--quantiles", "0.3", "--no-random", "--batch-size", "6", "--import", "user_ablation",
                 "--ablation", json.dumps(spec), "--ablation", "static:0.1/2.3", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    results = SweepResults.load(out)
    custom, static = results.ablation_keys
    assert results.records[custom].ablation == spec and results.records[static].ablation["kind"] == "static"
    assert results.records[custom].loglikelihoods == results.records[static].loglikelihoods
    assert results.records[custom].realized_fraction == results.records[static].realized_fraction == 2 / 12
    assert json.loads((out / "sweep.json").read_text())["imports"] == ["user_ablation"]
    for rid in (custom, static):  # a row each, below the ranking, with the run's own accuracy
        row = re.search(rf"^{re.escape(rid)}  .*$", text, re.M).group(0)
        accuracy = re.findall(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", row)[0]
        assert float(accuracy[0]) == pytest.approx(results.records[rid].accuracy_percent, abs=0.05), row
    assert custom not in text[:text.index("fixed ablations")]
