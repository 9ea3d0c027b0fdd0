"""A folder describes its scores: a sweep run with a user's score module renders, compares and loads
in a process that cannot import that module (the report used to ask the registry for the score's
direction and fail: "error: unknown score 'my_ahon'").

The user's score flags heads *above* τ, where a score nobody describes is drawn as "below", and
has a label of its own; both must come from the folder."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import TINY_VOCAB, _word_tokenizer, save_tiny_family

from inactive_heads.cli import main

REPO = Path(__file__).resolve().parents[2]
USER_MODULE = "my_lab_scores_portable"
USER_SCORES = f"""
import inactive_heads as ih


@ih.register_score("my_ahon", reads=("z",), direction="above", label="My lab's AHON")
def my_ahon(acts):
    return acts.z.norm(dim=-1).mean(dim=1)
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two sweeps (two copies of one tiny model, so two cells) run with the user's module."""
    root = tmp_path_factory.mktemp("portable")
    (root / "modules").mkdir()
    (root / "modules" / f"{USER_MODULE}.py").write_text(USER_SCORES)
    model = root / "tiny-a"
    save_tiny_family("llama-3.2", model, _word_tokenizer(root / "tokenizer", TINY_VOCAB))
    shutil.copytree(model, root / "tiny-b")
    sys.path.insert(0, str(root / "modules"))
    try:
        for name in ("a", "b"):
            code = main(["sweep", "--model", str(root / f"tiny-{name}"), "--task", "piqa", "--limit", "4",
                         "--scores", "my_ahon", "awft", "--import", USER_MODULE, "--quantiles", "0", "0.3",
                         "--dtype", "float32", "--device", "cpu", "--batch-size", "8", "--out", str(root / name)])
            assert code == 0
    finally:
        sys.path.remove(str(root / "modules"))
        sys.modules.pop(USER_MODULE, None)
    return root


def run_elsewhere(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """A fresh Python with this checkout importable and the user's module not."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


CLI = "import sys; from inactive_heads.cli import main; sys.exit(main(sys.argv[1:]))"


def test_the_folder_describes_the_users_score(folders):
    stored = json.loads((folders / "a" / "sweep.json").read_text())
    assert stored["format_version"] == 3
    assert stored["score_info"]["my_ahon"] == {"label": "My lab's AHON", "direction": "above", "reads": ["z"]}


def test_report_renders_without_the_users_module(folders, tmp_path):
    missing = run_elsewhere(tmp_path, "-c", f"import {USER_MODULE}")
    assert missing.returncode != 0 and "ModuleNotFoundError" in missing.stderr  # the module is not there
    done = run_elsewhere(tmp_path, "-c", CLI, "report", str(folders / "a"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "My lab's AHON" in done.stdout
    html = (folders / "a" / "report.html").read_text()
    # the heatmap is of the user's score (the first recorded), outlined in its own direction
    assert '"text":"My lab\'s AHON: mean over sequences"' in html and "whose average is &gt; τ" in html


def test_report_compare_and_the_python_load_path_without_the_users_module(folders, tmp_path):
    done = run_elsewhere(tmp_path, "-c", CLI, "report", "--compare", str(folders / "a"), str(folders / "b"),
                         "--compare-out", str(tmp_path / "compare"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank_my_ahon" in done.stdout and (tmp_path / "compare" / "compare.html").is_file()
    load = ("import sys, inactive_heads as ih; r = ih.sweep_results(sys.argv[1]); "
            "print(r.score_label('my_ahon'), '|', r.score_direction('my_ahon'), '|', len(ih.load_results(sys.argv[1])), "
            "'|', r.table().set_index('score').loc['my_ahon', 'label'])")
    loaded = run_elsewhere(tmp_path, "-c", load, str(folders / "a"))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("|") == ["My lab's AHON ", " above ", " 7 ", " My lab's AHON\n"]  # 1 + 3 x 2 runs
