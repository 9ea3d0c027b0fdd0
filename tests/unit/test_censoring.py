"""A max-% curve that never reaches its line is a lower bound, said so everywhere (issue 30).

Expected values are worked out by hand in the comments: the crossing x by linear interpolation,
the bound as the largest realized x, and a bootstrap whose replicates are given explicitly so
that which of them cross, and where, can be counted on paper.
"""

import json
import re

import numpy as np
import pytest
from synthetic_sweep import write_synthetic_sweep

from inactive_heads.analysis import (
    MaxWithin,
    curve_intervals,
    max_fraction_table,
    max_fraction_within,
    max_fraction_within_censored,
    table2,
)
from inactive_heads.cli import main
from inactive_heads.reporting.report import _best_key, format_table, render_report, summary_table
from inactive_heads.sweep.grid import _markdown, compare_table
from inactive_heads.sweep.results import SweepResults

# ---- one curve --------------------------------------------------------------------------------


def test_a_curve_above_its_line_everywhere_is_a_bound_at_its_largest_x():
    above = [(10.0, 59.5), (0.0, 60.0), (25.0, 59.2)]  # line 59: never reached; largest x 25
    assert max_fraction_within_censored(above, 60.0) == MaxWithin(25.0, censored=True, below=False)
    assert max_fraction_within(above, 60.0) == 0.0  # the paper's rule, still the default
    assert max_fraction_within(above, 60.0, if_never_crosses="max_x") == 25.0


def test_a_curve_that_crosses_is_not_censored():
    crossing = [(0.0, 60.0), (10.0, 59.5), (20.0, 57.5)]  # 10 + (59 - 59.5) / (57.5 - 59.5) * 10 = 12.5
    assert max_fraction_within_censored(crossing, 60.0) == MaxWithin(12.5, censored=False, below=False)
    assert max_fraction_within(crossing, 60.0) == 12.5


def test_a_curve_below_its_line_everywhere_is_zero_and_said_below():
    below = [(5.0, 50.0), (10.0, 40.0)]  # the truth is below the smallest tested x, 5
    assert max_fraction_within_censored(below, 60.0) == MaxWithin(0.0, censored=False, below=True)
    assert max_fraction_within(below, 60.0, if_never_crosses="max_x") == 0.0


def test_table2_keeps_the_papers_zero_and_flags_it():
    curves = {"m": {"awft": [(0, 50.0), (30, 49.5)],  # never crosses: paper 0, bound 30
                    "ahon_ln": [(0, 50.0), (10, 48.0)]}}  # crosses at 0 + (49 - 50) / (48 - 50) * 10 = 5
    paper = table2(curves, {"m": 50.0}).iloc[0]
    assert (paper["awft_max_pct"], paper["awft_censored"]) == (0.0, True)
    assert (paper["best_other_max_pct"], paper["best_other_censored"], paper["delta"]) == (5.0, False, 5.0)
    bound = table2(curves, {"m": 50.0}, if_never_crosses="max_x").iloc[0]
    assert (bound["awft_max_pct"], bound["awft_censored"], bound["delta"]) == (30.0, True, -25.0)
    assert max_fraction_table(curves, {"m": 50.0}, if_never_crosses="max_x").loc["m", "awft"] == 30.0
    assert max_fraction_table(curves, {"m": 50.0}).loc["m", "awft"] == 0.0


# ---- the bootstrap ----------------------------------------------------------------------------

# Four questions; values in % per question. Baseline and the run at x = 5 answer alike; the run at
# x = 10 loses question 1.
BASE = np.array([100.0, 100.0, 0.0, 0.0])
RUNS = [(5.0, np.array([100.0, 100.0, 0.0, 0.0])), (10.0, np.array([100.0, 0.0, 0.0, 0.0]))]
INDICES = np.array([
    [0, 0, 0, 0],  # base 100, y 100, 100; line 99: never reached -> a bound at 10
    [1, 1, 1, 1],  # base 100, y 100, 0: crosses at 5 + (99 - 100) * 5 / (0 - 100) = 5.05
    [2, 2, 2, 2],  # base 0, y 0, 0; line -1: never reached -> a bound at 10
    [0, 1, 2, 3],  # base 50, y 50, 25: 5 + (49 - 50) * 5 / (25 - 50) = 5.2
    [1, 1, 0, 0],  # base 100, y 100, 50: 5 + (-1) * 5 / (-50) = 5.1
])
# Sorted with the two censored replicates at the top: 5.05, 5.1, 5.2, [10], [10].
# The estimate (all four questions) is replicate 3's curve: 5.2, crossing.


def _row(level):
    return curve_intervals({"s": RUNS}, BASE, 1.0, indices=INDICES, level=level).iloc[0]


def test_replicates_that_do_not_cross_rank_above_the_crossing_ones_and_are_counted():
    row = _row(0.5)  # quantiles 0.25 and 0.75: positions 1 and 3 of 0..4
    assert row["max_pct_within"] == pytest.approx(5.2) and not row["max_pct_within_censored"]
    assert row["max_pct_within_uncrossed"] == 2
    assert row["max_pct_within_low"] == pytest.approx(5.1) and not row["max_pct_within_low_censored"]
    assert row["max_pct_within_high"] == 10.0 and row["max_pct_within_high_censored"]  # a bound: >= 10


def test_an_end_between_a_crossing_and_a_censored_replicate_is_a_bound():
    row = _row(0.25)  # quantiles 0.375 and 0.625: positions 1.5 and 2.5
    assert row["max_pct_within_low"] == pytest.approx((5.1 + 5.2) / 2) and not row["max_pct_within_low_censored"]
    assert row["max_pct_within_high"] == pytest.approx((5.2 + 10.0) / 2) and row["max_pct_within_high_censored"]


def test_a_curve_whose_every_replicate_stays_above_is_censored_through_and_through():
    flat = [(5.0, BASE), (12.0, BASE)]  # every run answers as the baseline
    row = curve_intervals({"s": flat}, BASE, 1.0, indices=INDICES, level=0.5).iloc[0]
    assert row["max_pct_within"] == 12.0 and row["max_pct_within_censored"]
    assert row["max_pct_within_uncrossed"] == len(INDICES)
    assert row["max_pct_within_low"] == row["max_pct_within_high"] == 12.0
    assert row["max_pct_within_low_censored"] and row["max_pct_within_high_censored"]


# ---- a sweep that never crosses, and one that crosses -----------------------------------------


@pytest.fixture
def never_crossing(tmp_path):
    """Baseline 50 (line 49), quantiles 0, 5 %, 10 % (see write_synthetic_sweep):
    AHON (LN) (0, 50), (5, 49.75), (10, 49.5): never reaches the line, a bound at 10 (AUC 49.75);
    AWFT (0, 50), (10, 49), (20, 48): touches it at 10, crossing (AUC 49.0);
    Random (0, 50), (5, 45), (10, 40): crosses at 0 + (49 - 50) * 5 / (45 - 50) = 1."""
    return write_synthetic_sweep(tmp_path / "never", scores=("ahon_ln", "awft"), quantiles=(0.0, 0.05, 0.1))


def test_summary_table_of_a_never_crossing_sweep(never_crossing):
    frame = summary_table(SweepResults.load(never_crossing)).set_index("score")
    assert frame.loc["ahon_ln", "max_pct_within"] == 10.0 and frame.loc["ahon_ln", "max_pct_within_censored"]
    assert frame.loc["awft", "max_pct_within"] == 10.0 and not frame.loc["awft", "max_pct_within_censored"]
    assert frame.loc["random", "max_pct_within"] == pytest.approx(1.0)
    assert not frame.loc["random", "max_pct_within_censored"]
    # The synthetic runs are right exactly where they agree with the baseline: the same reading.
    assert frame.loc["ahon_ln", "max_pct_agree"] == 10.0 and frame.loc["ahon_ln", "max_pct_agree_censored"]
    # The estimate's own curve stays above, so the upper end is at the bound, and a bound.
    assert frame.loc["ahon_ln", "max_pct_within_high"] == 10.0 and frame.loc["ahon_ln", "max_pct_within_high_censored"]
    assert 0 < frame.loc["ahon_ln", "max_pct_within_uncrossed"] <= 2000


def test_the_bound_ranks_by_its_value_and_ties_go_to_the_better_auc(never_crossing):
    frame = summary_table(SweepResults.load(never_crossing))
    # AHON (LN)'s bound 10 ties AWFT's value 10; AHON (LN)'s AUC (49.75) beats AWFT's (49.0). Read as
    # 0, AHON (LN) would come after AWFT.
    assert _best_key(frame) == "ahon_ln"
    assert list(frame["score"]) == ["ahon_ln", "awft", "random"]  # the summary's rank: by AUC
    html = render_report(SweepResults.load(never_crossing))
    table = html[html.index('id="max-within"'):html.index("</table>", html.index('id="max-within"'))]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
    assert [c[1] for c in cells] == ["<code>ahon_ln</code>", "<code>awft</code>", "<code>random</code>"]
    assert cells[0][2].startswith("≥ 10.00") and "not reached: add larger quantiles" in cells[0][2]
    assert cells[1][2] == "10.00"  # AWFT crosses: a plain number
    assert "<code>ahon_ln</code>" in re.search(r'<tr class="best">(.*?)</tr>', table).group(1)
    sentence = re.search(r"Best score other than AWFT: (.*?)</p>", html).group(1)
    assert "≥ 10.00% zeroed" in sentence and "difference at least +0.00 points" in sentence


def test_the_text_table_marks_the_bound_and_counts_the_resamples(never_crossing):
    results = SweepResults.load(never_crossing)
    frame = summary_table(results).set_index("score")
    text = format_table(results)
    ahon = next(line for line in text.splitlines() if line.lstrip().startswith("1  AHON (LN)"))
    awft = next(line for line in text.splitlines() if line.lstrip().startswith("2  AWFT"))
    assert ahon.split("AHON (LN)")[1].split()[:2] == ["≥", "10.0"]
    assert "≥" not in awft.split("AWFT")[1].split("[")[0]
    count = int(frame.loc["ahon_ln", "max_pct_within_uncrossed"])
    note = next(line for line in text.splitlines() if line.startswith("  AHON (LN):"))
    assert f"within 1 pt ≥ 10.0 (not reached: add larger quantiles), {count} of 2000 resamples" in note


def test_compare_table_reads_the_bound_and_keeps_the_papers_rule(never_crossing, tmp_path):
    crossing = write_synthetic_sweep(tmp_path / "crossing")
    config = json.loads((crossing / "sweep.json").read_text())
    config["model"] = "toy-crossing"
    (crossing / "sweep.json").write_text(json.dumps(config))
    table = compare_table([never_crossing, crossing]).set_index("model")
    never, crosses = table.loc["toy-model"], table.loc["toy-crossing"]
    # Never-crossing sweep: AHON (LN)'s bound 10 beats Random's 1; the paper's rule counts it 0.
    assert (never["best_other"], never["best_other_max_pct"], never["best_other_censored"]) == ("ahon_ln", 10.0, True)
    assert never["best_other_paper_rule"] == "random"
    assert never["best_other_max_pct_paper_rule"] == pytest.approx(1.0)
    assert (never["awft_max_pct"], never["awft_censored"]) == (10.0, False)
    # Crossing sweep: both rules agree (AHON (LN) 20, AWFT 10: tests/unit/test_report.py).
    assert (crosses["best_other"], crosses["best_other_max_pct"], crosses["best_other_censored"]) == ("ahon_ln", 20.0, False)
    assert crosses["best_other_max_pct_paper_rule"] == 20.0 and crosses["awft_max_pct_paper_rule"] == 10.0
    md = _markdown(table.reset_index()).splitlines()
    assert md[2].split(" | ")[list(table.reset_index().columns).index("best_other_max_pct") - 1] == "≥ 10.00"
    assert "≥" not in md[3]


def test_report_compare_writes_the_flags_to_csv(never_crossing, tmp_path, capsys):
    import pandas as pd

    crossing = write_synthetic_sweep(tmp_path / "crossing")
    config = json.loads((crossing / "sweep.json").read_text())
    config["model"] = "toy-crossing"
    (crossing / "sweep.json").write_text(json.dumps(config))
    assert main(["report", "--compare", str(never_crossing), str(crossing), "--compare-out", str(tmp_path / "c")]) == 0
    csv = pd.read_csv(tmp_path / "c" / "compare.csv").set_index("model")
    assert csv.loc["toy-model", "best_other_censored"] and not csv.loc["toy-crossing", "best_other_censored"]
    assert "≥ 10.00" in (tmp_path / "c" / "compare.html").read_text(encoding="utf-8")


def test_a_crossing_sweep_shows_no_bound_in_its_estimates(tmp_path):
    results = SweepResults.load(write_synthetic_sweep(tmp_path / "crossing"))
    frame = summary_table(results)
    assert not frame["max_pct_within_censored"].any() and not frame["max_pct_agree_censored"].any()
    rows = [re.split(r"\s{2,}", line.strip()) for line in format_table(results).splitlines()
            if re.match(r"^ +\d  ", line)]
    assert len(rows) == 4 and not any(cells[2].startswith("≥") or cells[4].startswith("≥") for cells in rows)
    # AHON (LN)'s curve touches its line at 20 of its 30 %; resamples that do not reach it count as
    # 30. When more than 2.5 % of the 2000 do (50), the upper end sits among them: "≥ 30.0".
    ahon = frame.set_index("score").loc["ahon_ln"]
    assert ahon["max_pct_within_uncrossed"] > 50
    assert next(cells for cells in rows if cells[1] == "AHON (LN)")[2].endswith(", ≥ 30.0]")


def test_report_json_carries_the_flag_and_the_bound(never_crossing, capsys):
    assert main(["report", str(never_crossing), "--json"]) == 0
    records = {r["score"]: r for r in json.loads(capsys.readouterr().out)}
    ahon, awft = records["ahon_ln"]["max_pct_within"], records["awft"]["max_pct_within"]
    assert (ahon["value"], ahon["censored"], ahon["high"], ahon["high_censored"]) == (10.0, True, 10.0, True)
    assert 0 < ahon["uncrossed"] <= ahon["resamples"] == 2000
    assert (awft["value"], awft["censored"]) == (10.0, False)
    assert records["ahon_ln"]["max_pct_agree"]["censored"] is True
    assert records["random"]["max_pct_within"]["value"] == pytest.approx(1.0)
    assert not (never_crossing / "report.html").exists()  # --json writes no HTML
