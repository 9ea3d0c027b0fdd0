"""The command line as a user runs it: a real process per sub-command."""

import os
import subprocess
import sys

import pytest

from inactive_heads import cli
from fuzz_harness import (
    REPO,
)


SUBPROCESS_CASES = {
    "models": ["models", "--jsn"],
    "score": ["score", "--scores", "ahon_ln2", "--out", "{tmp}/s.safetensors"],
    "calibrate": ["calibrate", "{tmp}/missing.safetensors"],
    "export": ["export", "--model", "no-such-model", "--heads", "{tmp}/missing.json", "--out", "{tmp}/out"],
    "sweep": ["sweep", "--quantiles", "nan", "--out", "{tmp}/out"],
    "grid": ["grid", "{tmp}/missing.toml"],
    "report": ["report", "{tmp}"],
    "demo": ["demo", "--task", "piqa", "--subjects", "anatomy", "--out", "{tmp}/demo"],
    "predict": ["predict", "eval", "{tmp}/no-predictor"],
}


@pytest.mark.parametrize("command", sorted(SUBPROCESS_CASES))
def test_a_real_process_exits_2_with_one_line_and_no_traceback(command, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in SUBPROCESS_CASES[command]]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("INACTIVE_HEADS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "inactive_heads.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and lines[0].startswith("inactive-heads"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a failing command left files behind"


def test_a_real_process_reports_a_toolkit_failure_as_a_bug(tmp_path):
    # The other class of error: an InactiveHeadsError that is not a UserError, raised by a sub-command.
    script = ("import sys; from inactive_heads import cli; from inactive_heads.core.errors import InactiveHeadsError\n"
              "def fail(args):\n    raise InactiveHeadsError('weights did not convert cleanly')\n"
              "cli.SUBCOMMANDS['models'] = cli.Subcommand('fails', lambda parser: None, fail)\n"
              "sys.exit(cli.main(['models']))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("INACTIVE_HEADS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "a bug" in lines[0] and "docs/errors.md#reporting-a-bug" in lines[0]


def test_every_sub_command_has_a_real_process_case():
    assert sorted(SUBPROCESS_CASES) == sorted(cli.SUBCOMMANDS)



