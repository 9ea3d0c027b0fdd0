"""The same numbers on both TransformerLens lines: SmolLM2-135M and Qwen2.5-Coder-0.5B on 3.9
(``HookedTransformer``) and 4 (``TransformerBridge``).

tests/cross_line.py computes, on the line of the interpreter that runs it, the 13 paper scores of
every (sequence, layer, head) on MMLU prompts, thresholds calibrated on them, every dynamic zeroing
decision per (sequence, layer, head), answers and log-likelihoods on MMLU, PIQA and WinoGrande
(baseline and dynamic), and GSM8K tokens in both decision modes. This test runs it under this
interpreter and under the other line's (``IH_OTHER_PYTHON``, which ``make`` sets to the other
line's virtualenv when it exists) and compares the two: two implementations of the same model
(TransformerLens's own components against the Hugging Face modules the bridge wraps), neither
computing the other's numbers. Each line is also checked against Hugging Face directly by
test_models.py, test_scores_reference.py and test_evaluate_independent.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "cross_line.py"
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")
SCORE_RTOL = 1e-5  # of each score's largest magnitude on these inputs
THRESHOLD_RTOL = 1e-5
# Summed log-likelihoods: within 1e-4, or 1e-4 of their size for long sums. With half of Qwen's heads
# zeroed the two lines' sums of a WinoGrande continuation (about -28) differ by 1.3e-3 (4.7e-5 of
# it) with the same heads zeroed and the same answers; unablated they differ by at most 4.6e-5.
LL_ATOL, LL_RTOL = 1e-4, 1e-4


def _line(python: str) -> str:
    code = "from importlib.metadata import version; print(version('transformer-lens'))"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def both_lines(tmp_path_factory):
    other = os.environ.get("IH_OTHER_PYTHON", "")
    if not other or not os.access(other, os.X_OK):
        pytest.skip("no other TransformerLens line to compare with: set IH_OTHER_PYTHON to its interpreter "
                    "(make does when the other line's virtualenv exists: make setup TL=3.9 or TL=4)")
    ours, theirs = _line(sys.executable), _line(other)
    if ours.split(".")[0] == theirs.split(".")[0]:
        pytest.skip(f"IH_OTHER_PYTHON has transformer-lens {theirs}, the same line as this one ({ours})")
    folder = tmp_path_factory.mktemp("cross_line")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {}
    for label, python in (("this", sys.executable), ("other", other)):
        out = folder / f"{label}.json"
        runs[label] = (out, subprocess.Popen([python, str(SCRIPT), str(out), "--models", *MODELS], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = {}
    for label, (out, proc) in runs.items():
        log, _ = proc.communicate()
        assert proc.returncode == 0, f"tests/cross_line.py failed under the {label} line:\n{log[-4000:]}"
        results[label] = json.loads(out.read_text())
    by_line = {r["transformer_lens"].split(".")[0]: r for r in results.values()}
    return by_line["3"], by_line["4"]


@pytest.mark.parametrize("name", MODELS)
def test_the_two_lines_run_different_classes(both_lines, name):
    old, new = (r["models"][name] for r in both_lines)
    assert (old["class"], new["class"]) == ("HookedTransformer", "TransformerBridge")


@pytest.mark.parametrize("name", MODELS)
def test_scores_and_thresholds_agree(both_lines, name):
    old, new = (r["models"][name] for r in both_lines)
    assert set(old["scores"]) == set(new["scores"]) and len(old["scores"]) == 13
    for key in old["scores"]:
        a, b = np.asarray(old["scores"][key]), np.asarray(new["scores"][key])
        assert a.shape == b.shape == (len(a), old["n_layers"], old["n_heads"])
        scale = np.abs(a).max()
        assert np.abs(a - b).max() <= SCORE_RTOL * scale, key
    a, b = np.asarray(old["thresholds"]), np.asarray(new["thresholds"])
    assert np.all(np.abs(a - b) <= THRESHOLD_RTOL * np.abs(a))


@pytest.mark.parametrize("name", MODELS)
def test_every_decision_answer_and_log_likelihood_agrees(both_lines, name):
    old, new = (r["models"][name] for r in both_lines)
    assert set(old["tasks"]) == set(new["tasks"]) and len(old["tasks"]) == 6
    for task in old["tasks"]:
        a, b = old["tasks"][task], new["tasks"][task]
        assert a["correct"] == b["correct"], task
        lls_a, lls_b = np.concatenate([np.asarray(x) for x in a["loglikelihoods"]]), \
            np.concatenate([np.asarray(x) for x in b["loglikelihoods"]])
        assert np.all(np.abs(lls_a - lls_b) <= np.maximum(LL_ATOL, LL_RTOL * np.abs(lls_a))), task
        assert a.get("flagged") == b.get("flagged"), task  # every (sequence, layer, head) decision
        if task.endswith("dynamic"):
            assert 0.0 < a["realized_fraction"] < 1.0  # the threshold zeroes some heads, not all
    assert old["gsm8k"] == new["gsm8k"]  # per_step and prompt: the same tokens, the same zeroing
