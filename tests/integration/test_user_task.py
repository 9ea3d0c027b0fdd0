"""A task registered in user code (tests/integration/user_task.py: a tiny multiple-choice task with
its documents inline) runs everywhere a built-in one does: ``ih.evaluate``, a local sweep and
``inactive-heads report`` on its folder (the Ray sweep: tests/integration/test_distributed.py).

The expected outcomes come from an independent path (tests/reference_user_task.py): the prompt written
out by hand, the Hugging Face tokenizer and the plain Hugging Face model's forward pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reference_user_task import PROMPT_HEAD, outcomes_by_hand, tiny_llama_dir

import inactive_heads as ih
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.run import run_sweep


@pytest.fixture(scope="module")
def user_task():
    """The user module imported, its task unregistered afterwards."""
    import user_task as module

    yield module
    ih.unregister_task(module.NAME)
    sys.modules.pop("user_task", None)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def by_hand(user_task, tiny_dir):
    return outcomes_by_hand(tiny_dir, user_task.DOCS["test"])


def test_the_prompt_is_the_one_written_by_hand(user_task, tiny_dir):
    from transformers import AutoTokenizer

    reqs = ih.build_requests(user_task.NAME, AutoTokenizer.from_pretrained(tiny_dir), limit=2)
    assert reqs[1].context_text == PROMPT_HEAD + "Q: What is the capital of Italy?\nA:"
    assert [c.continuation_text for c in reqs[1].choices] == [" Berlin", " Rome", " Lisbon"]
    assert [r.gold for r in reqs] == [0, 1] and reqs[0].fewshot_ids == (0,)


def test_evaluate_runs_a_user_task(user_task, tiny_dir, by_hand):
    model = ih.load_model(tiny_dir, dtype="float32")
    result = ih.evaluate(model, user_task.NAME, batch_size=3, progress=False)
    correct, correct_norm = by_hand
    assert 0 < sum(correct) < len(correct) or 0 < sum(correct_norm) < len(correct_norm)  # not all alike
    assert (result.correct, result.correct_norm) == (correct, correct_norm)
    assert result.metrics == {"acc": sum(correct) / 8, "acc_norm": sum(correct_norm) / 8}


def test_a_local_sweep_of_a_user_task_and_its_report_without_the_module(user_task, tiny_dir, by_hand, tmp_path):
    config = SweepConfig(model=tiny_dir, task=user_task.NAME, scores=["ahon_ln"], quantiles=[0.0, 0.3],
                         dtype="float32", batch_size=4, imports=["user_task"])
    results = run_sweep(config, tmp_path / "sweep", progress=False)
    assert results.is_complete
    assert results.records["baseline"].correct == by_hand[0]
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["task"] == user_task.NAME
    # A fresh process that never imports the user module (only the package is on its path).
    env = {**os.environ, "PYTHONPATH": str(Path(ih.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "inactive_heads.cli", "report", str(tmp_path / "sweep")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"on {user_task.NAME}" in done.stdout and (tmp_path / "sweep" / "report.html").is_file()
    assert user_task.NAME in (tmp_path / "sweep" / "report.html").read_text()


def test_the_command_line_sweeps_a_task_its_import_registers(tiny_dir, by_hand, tmp_path):
    """``--task`` is checked against the tasks registered by ``--import`` (a fresh process: the task
    is known only once the module is imported; before, the command refused the name)."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), str(Path(ih.__file__).parents[1])])}
    out = tmp_path / "cli_sweep"
    done = subprocess.run([sys.executable, "-m", "inactive_heads.cli", "sweep", "--import", "user_task",
                           "--task", "user_capitals", "--model", str(tiny_dir), "--dtype", "float32",
                           "--scores", "ahon_ln", "--quantiles", "0.3", "--no-random", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((out / "sweep.json").read_text())
    assert config["task"] == "user_capitals" and config["imports"] == ["user_task"]
    from inactive_heads.sweep.results import SweepResults

    assert SweepResults.load(out).records["baseline"].correct == by_hand[0]
