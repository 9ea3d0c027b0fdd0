"""The HTML report and the terminal table, on synthetic sweep folders (structure, not bytes)."""

import json
import re

import pytest
from synthetic_sweep import write_synthetic_sweep

from inactive_heads.reporting.report import format_table, missing_runs, summary_table, write_report
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.results import SweepResults

LABELS = ["AHON (LN)", "AWFT", "AEQD", "Random"]
# Synthetic curves (see write_synthetic_sweep): baseline 50, line at 49.
MAX_WITHIN = {"ahon_ln": 20.0, "awft": 10.0, "aeqd": 20 / 3, "random": 1.0}


@pytest.fixture
def sweep_dir(tmp_path):
    return write_synthetic_sweep(tmp_path / "sweep")


def test_write_report_is_self_contained(sweep_dir):
    path = write_report(sweep_dir)
    assert path == sweep_dir / "report.html" and path.is_file()
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # plotly.js inline, exactly once, and no script loaded from anywhere
    assert text.count("plotly.js v") == 1
    assert not re.search(r"<script[^>]*\bsrc=", text)
    assert 'src="https://cdn.plot.ly' not in text
    assert text.count("Plotly.newPlot(") >= 6
    for div in ("fig-curves", "fig-ranking", "fig-by-layer", "fig-heatmap", "fig-flag-rate", "fig-distribution",
                "fig-layer-profiles", "fig-iou"):
        assert f'id="{div}"' in text
    # no temp file left behind
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.startswith(".")) == []


def test_report_header_and_tables(sweep_dir):
    text = write_report(sweep_dir).read_text(encoding="utf-8")
    assert "Inactive heads: toy-model on mmlu" in text
    for field in ("model", "task", "subjects", "limit", "questions (n)", "report written", "toolkit version"):
        assert f"<dt>{field}</dt>" in text
    assert "<dd>anatomy</dd>" in text and "<dd>400</dd>" in text
    assert "inactive-heads " in text
    table = text[text.index('id="max-within"'):]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)[1:]
    assert len(rows) == 4
    # sorted by max % within, best first, with the values
    for row, (key, value) in zip(rows, sorted(MAX_WITHIN.items(), key=lambda kv: -kv[1])):
        assert f"<code>{key}</code>" in row and f">{value:.2f}<" in row
    assert '<tr class="best">' in table and "AHON (LN)" in table.split('<tr class="best">')[1].split("</tr>")[0]
    assert "Baseline accuracy (nothing zeroed): <b>50.00%</b>" in text
    assert 'id="thresholds-table"' in text and "p = 30%" in text
    assert "inactive if &gt; τ" in text and "inactive if &lt; τ" in text
    assert "Best score other than AWFT: <b>AHON (LN)</b>" in text
    assert "AHON (LN) by layer" in text
    assert "partial sweep" not in text.lower()


def test_report_custom_path_and_tolerance(sweep_dir, tmp_path):
    out = write_report(sweep_dir, tmp_path / "out" / "r.html", tolerance=2)
    assert out == tmp_path / "out" / "r.html" and out.is_file()
    text = out.read_text(encoding="utf-8")
    assert "within 2 pt" in text and "within 1 pt" not in text
    assert not (sweep_dir / "report.html").exists()


def test_report_without_scores_pt(tmp_path):
    path = write_synthetic_sweep(tmp_path / "s", with_scores_pt=False)
    text = write_report(path).read_text(encoding="utf-8")
    assert 'id="fig-curves"' in text and 'id="fig-heatmap"' not in text and 'id="fig-iou"' not in text


def test_report_heatmap_falls_back_to_first_recorded_score(tmp_path):
    path = write_synthetic_sweep(tmp_path / "s", scores=["awft", "aeqd"])
    text = write_report(path).read_text(encoding="utf-8")
    assert 'id="fig-heatmap"' in text and "AWFT: mean over sequences" in text


def test_partial_sweep(tmp_path):
    path = write_synthetic_sweep(tmp_path / "s", skip=["baseline", "awft@p=0.3", "aeqd@p=0.25"])
    results = SweepResults.load(path)
    assert missing_runs(results) == ["baseline", "awft@p=0.3", "aeqd@p=0.25"]
    frame = summary_table(results)
    assert frame["max_pct_within"].isna().all() and list(frame["rank"]) == [1, 2, 3, 4]
    assert frame.set_index("score").loc["awft", "points"] == 6

    text = write_report(path).read_text(encoding="utf-8")
    assert "Partial sweep: 26 of 29 runs finished" in text
    assert "awft@p=0.3" in text and "No baseline run yet" in text
    assert 'id="fig-curves"' in text

    table = format_table(results)
    assert "not run yet" in table and "partial sweep: 26 of 29" in table and "—" in table


def test_report_of_an_empty_sweep(tmp_path):
    path = tmp_path / "empty"
    path.mkdir()
    (path / "sweep.json").write_text(json.dumps(SweepConfig(scores=["ahon_ln"]).to_dict()))
    text = write_report(path).read_text(encoding="utf-8")
    assert "No ablation run has finished yet" in text and "No <code>thresholds.json</code>" in text
    assert 'id="fig-curves"' not in text
    assert "no ablation run has finished yet" in format_table(path)


def test_format_table(sweep_dir):
    text = format_table(SweepResults.load(sweep_dir))
    lines = text.splitlines()
    assert lines[0] == "toy-model on mmlu (400 questions)"
    # 200 of 400 right: scipy's Wilson interval is 45.1 to 54.9; the bootstrap's is close to it.
    low, high = map(float, re.search(r"50\.00% \(95% interval ([\d.]+) to ([\d.]+)\)", lines[1]).groups())
    assert low == pytest.approx(45.1, abs=0.4) and high == pytest.approx(54.9, abs=0.4)
    # n = 400 cannot resolve 1 point; (2 * 1.96)^2 * 0.5 * 0.5 / 0.01^2 = 38,415 questions would.
    assert "cannot resolve 1 pt" in lines[2] and "about 38,415 questions" in lines[2]
    header = next(line for line in lines if line.startswith("rank"))
    assert "score" in header and "max % zeroed within 1 pt" in header
    assert "normalized AUC" in header and "max realized %" in header and "agreement >= 99%" in header
    rows = lines[lines.index(header) + 2 : lines.index(header) + 6]
    # Ranked by normalized AUC, computed by hand from the synthetic curves (write_synthetic_sweep):
    # AHON (LN) 49.25, AWFT 47.0, AEQD 43.25 (quantized to 1/400), Random 35.0.
    assert [row.split()[0] for row in rows] == ["1", "2", "3", "4"]
    assert [next(lab for lab in LABELS if lab in row) for row in rows] == ["AHON (LN)", "AWFT", "AEQD", "Random"]
    # AHON (LN): the curve touches baseline - 1 = 49 at 20 % zeroed (see write_synthetic_sweep);
    # AUC: trapezoid of (0,50) ... (30,48.5) by hand = 49.25. The synthetic runs are right
    # exactly when their answer agrees with the baseline's, so agreement gives the same 20 %.
    ahon = next(row for row in rows if "AHON (LN)" in row)
    numbers = re.findall(r"-?\d+\.\d+", ahon)
    assert numbers[0] == "20.0" and numbers[3] == "49.2" and numbers[6] == "20.0" and numbers[-1] == "30.00"
    for estimate, low, high in zip(*[iter(map(float, numbers[:9]))] * 3):
        assert low <= estimate <= high
    assert format_table(sweep_dir) == text  # a path works too
    assert "within 2 pt" in format_table(sweep_dir, tolerance=2)


def test_format_table_per_run_rows_with_paired_intervals(sweep_dir):
    lines = format_table(sweep_dir, runs=True).splitlines()
    awft = next(line for line in lines if line.lstrip().startswith("awft@p=0.1"))
    # awft at p = 0.10: 20 % zeroed, 48.0 % right: the first 192 of the baseline's 200 right answers,
    # so the paired difference is -2.0 with an interval that excludes 0 (8 changed answers of 400,
    # all the same way), and agreement 98 %.
    assert "48.0 [" in awft and "-2.0 [" in awft and "98.0 [" in awft
    high = float(re.search(r"-2\.0 \[(-?[\d.]+), (-?[\d.]+)\]", awft).group(2))
    assert high < 0


def test_one_ranking_rule_with_a_constructed_tie(tmp_path):
    """Two scores with identical curves tie: the sweep table, the text table and the comparison
    across folders (grid's and report --compare's) all give them the same, best rank, and the next
    score the rank after both (1, 2, 2, 4 style)."""
    from inactive_heads.sweep.grid import compare_table

    folders = []
    for model in ("toy-a", "toy-b"):
        path = write_synthetic_sweep(tmp_path / model)
        config = json.loads((path / "sweep.json").read_text())
        config["model"] = model
        (path / "sweep.json").write_text(json.dumps(config))
        for run in sorted((path / "runs").glob("awft@*.json")):  # aeqd's runs become copies of awft's
            record = json.loads(run.read_text())
            twin = run.with_name(run.name.replace("awft@", "aeqd@"))
            record.update(run_id=record["run_id"].replace("awft@", "aeqd@"), score="aeqd", label="aeqd",
                          threshold=json.loads(twin.read_text())["threshold"])
            twin.write_text(json.dumps(record))
        folders.append(path)
    frame = summary_table(SweepResults.load(folders[0])).set_index("score")
    assert frame.loc["awft", "normalized_auc"] == frame.loc["aeqd", "normalized_auc"]
    ranks = frame["rank"].to_dict()
    assert ranks["awft"] == ranks["aeqd"]
    below = [k for k in ranks if frame.loc[k, "normalized_auc"] < frame.loc["awft", "normalized_auc"]]
    above = [k for k in ranks if frame.loc[k, "normalized_auc"] > frame.loc["awft", "normalized_auc"]]
    assert below and ranks["awft"] == 1 + len(above)
    assert all(ranks[k] >= ranks["awft"] + 2 for k in below)
    text = format_table(SweepResults.load(folders[0]))
    printed = {label: int(rank) for rank, label in re.findall(r"^ *(\d+)  (AWFT|AEQD)\b", text, re.M)}
    assert printed == {"AWFT": ranks["awft"], "AEQD": ranks["aeqd"]}
    compared = compare_table(folders)
    for _, row in compared.iterrows():
        assert {k: row[f"rank_{k}"] for k in ranks} == ranks
