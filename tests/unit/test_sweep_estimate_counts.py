"""The estimator's work counts, by hand, and its command-line errors (no model needed)."""

from types import SimpleNamespace

import pytest

from inactive_heads import cli
from inactive_heads.sweep.estimate import PassWork, batch_work, plan_work, sample_indices


def plan_of(inputs):
    """A plan-like object: each input scores its last token (first scored position len - 1)."""
    return SimpleNamespace(inputs=inputs, targets=[[(i, 0, len(x) - 1, (x[-1],))] for i, x in enumerate(inputs)])


PREFIX = list(range(100, 140))  # 40 tokens shared by three inputs
INPUTS = [PREFIX + [1] * 10, PREFIX + [2] * 12, PREFIX + [3] * 20, [7] * 10]


def test_batch_work_by_hand():
    # lengths 60 52 | 50 10 in batches of 2: rows x width 2 x 60 + 2 x 50
    assert batch_work([50, 52, 60, 10], 2) == PassWork(inputs=4, batches=2, tokens=172, padded_tokens=220)
    assert batch_work([], 4) == PassWork()


def test_plan_work_counts_a_reused_prefix_once():
    assert plan_work(plan_of(INPUTS), 2, reuse=False) == PassWork(4, 2, 172, 220)
    # The three inputs share 40 tokens (>= max(32, median 52 / 2)): the prefix once, then their rests
    # 20 12 | 10 in batches of 2 (2 x 20 + 10 padded); the fourth input alone (one batch of 10).
    assert plan_work(plan_of(INPUTS), 2, reuse=True) == PassWork(4, 1 + 2, 10 + 42 + 40, 10 + 50 + 40)


def test_pass_work_adds_and_scales():
    assert PassWork(1, 2, 3, 4) + PassWork(10, 20, 30, 40) == PassWork(11, 22, 33, 44)
    assert PassWork(1, 2, 3, 4).times(3) == PassWork(3, 6, 9, 12)


def test_sample_is_whole_batches_longest_middle_and_shortest():
    plan = plan_of([[0] * n for n in (5, 9, 1, 7, 3, 8, 2, 6, 4)])  # lengths 9 8 | 7 6 | 5 4 | 3 2 | 1
    warm, sample = sample_indices(plan, 2, n_batches=3)
    assert warm == [1, 5]  # the longest batch warms up
    assert sample == sorted([1, 5, 0, 8, 2])  # batches 0, 2 and 4 (9 8, 5 4, 1)


def test_json_needs_estimate(capsys, tmp_path):
    assert cli.main(["sweep", "--out", str(tmp_path / "x"), "--json"]) == 2
    assert "--json applies to --estimate" in capsys.readouterr().err


def test_estimate_refuses_ray(capsys, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('models = ["smollm2-135m"]\nexecutor = "ray"\n[sweep]\nlimit = 2\nscores = ["awft"]\n')
    assert cli.main(["grid", str(grid), "--estimate"]) == 2
    assert "local executor" in capsys.readouterr().err
    assert cli.main(["sweep", "--out", str(tmp_path / "y"), "--executor", "ray", "--estimate"]) == 2
    assert "local executor" in capsys.readouterr().err
