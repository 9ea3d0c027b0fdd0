"""A sweep SIGKILLed at several points of its progress and resumed until done writes the same
records, to the byte, as one that ran without interruption (issue 47).

Each interruption is a real ``SIGKILL`` of a ``inactive-heads sweep`` process
(``paused_sweep.py`` stops it for good right after it has written a named file, so every kill
lands at a known point): after the baseline record (its scores not yet saved), after the scores
(the resumed process starts at an ablated run), and between ablated runs, mid-way through one
score and after a change of score. The resumed folder is then compared with the uninterrupted
one file by file.

Volatile fields, left out of the comparison (:data:`VOLATILE`): a record's ``seconds`` (the wall
time of its pass) and ``finished_at`` (the clock time it was written), and the recorded scores'
``seconds`` metadata (the wall time of the baseline pass). Everything else — log-likelihoods,
answers, realized fractions, thresholds, the scores themselves, ``torch_threads`` — must match.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import save_tiny_llama_with_smollm2_tokenizer

from inactive_heads.sweep.folder import read_json_file

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
# What may differ between two runs of the same pass: wall and clock times, nothing computed.
VOLATILE = {"seconds": "wall time of the run's pass", "finished_at": "clock time the record was written"}
SCORES_VOLATILE = {"seconds": "wall time of the baseline pass that recorded the scores"}
# Points of progress to kill at, in order: the baseline record (the scores are saved after it),
# the scores (the thresholds and every ablated run still to do), one run of each score.
KILL_AFTER = ("baseline.json", "scores.safetensors", "ahon_ln@p=0.1.json", "awft@p=0.1.json")
RUN_IDS = ("baseline", "ahon_ln@p=0.1", "ahon_ln@p=0.3", "awft@p=0.1", "awft@p=0.3")
WAIT_S = 900


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random-weight Llama saved with the SmolLM2 tokenizer: real PIQA prompts, fast passes."""
    return save_tiny_llama_with_smollm2_tokenizer(tmp_path_factory.mktemp("tiny-llama"))


def sweep_args(model: str, out: Path) -> list[str]:
    return ["sweep", "--model", model, "--task", "piqa", "--limit", "8", "--scores", "ahon_ln", "awft",
            "--quantiles", "0.1", "0.3", "--seed", "0", "--no-random", "--out", str(out)]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def run_until(stop_after: str, args: list[str], out: Path, log: Path) -> None:
    """Run the command until it has written ``stop_after`` (a file name under ``out``), then
    SIGKILL it; ``"-"``: run it to the end. The command runs in a process group of its own, which
    is SIGKILLed after it: what it started (an embedded Ray's processes) never outlives it."""
    command = [sys.executable, str(HERE / "paused_sweep.py"), stop_after, *args]
    with open(log, "a") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=environment(),
                                start_new_session=True)
        try:
            deadline = time.monotonic() + WAIT_S
            while stop_after == "-" or not any(out.rglob(stop_after)):
                if proc.poll() is not None:
                    assert proc.returncode == 0 and stop_after == "-", \
                        f"the sweep ended ({proc.returncode}) before writing {stop_after}; see {log}"
                    return
                assert time.monotonic() < deadline, f"no {stop_after} after {WAIT_S} s; see {log}"
                time.sleep(0.05)
            time.sleep(0.2)  # let the stop hook start sleeping: the kill lands right after the write
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # nothing left in the group
                pass
    assert proc.returncode == -signal.SIGKILL


def stable(record: dict, volatile) -> str:
    return json.dumps({k: v for k, v in record.items() if k not in volatile}, sort_keys=True)


def assert_same_folders(whole: Path, resumed: Path) -> None:
    from inactive_heads.scoring.recording import HeadScores

    assert sorted(p.name for p in (resumed / "runs").iterdir()) == sorted(f"{r}.json" for r in RUN_IDS)
    assert sorted(p.name for p in (whole / "runs").iterdir()) == sorted(f"{r}.json" for r in RUN_IDS)
    differing = [rid for rid in RUN_IDS if stable(read_json_file(resumed / "runs" / f"{rid}.json"), VOLATILE)
                 != stable(read_json_file(whole / "runs" / f"{rid}.json"), VOLATILE)]
    assert not differing, f"records differ from the uninterrupted sweep's: {differing}"
    for name in ("sweep.json", "thresholds.json"):
        assert (resumed / name).read_bytes() == (whole / name).read_bytes(), name
    a, b = HeadScores.load(whole / "scores.safetensors"), HeadScores.load(resumed / "scores.safetensors")
    assert a.keys() == b.keys() and all(a.scores[k].equal(b.scores[k]) for k in a.keys())
    assert stable(a.metadata, SCORES_VOLATILE) == stable(b.metadata, SCORES_VOLATILE)


def kill_and_resume(model: str, tmp_path: Path, kill_after=KILL_AFTER, extra: tuple[str, ...] = ()) -> None:
    whole, resumed, log = tmp_path / "whole", tmp_path / "resumed", tmp_path / "sweep.log"
    run_until("-", [*sweep_args(model, whole), *extra], whole, log)
    for point in kill_after:
        run_until(point, [*sweep_args(model, resumed), *extra], resumed, log)
        assert not (resumed / "runs.parquet").exists()  # killed before the end
    run_until("-", [*sweep_args(model, resumed), *extra], resumed, log)
    assert_same_folders(whole, resumed)


def test_a_killed_and_resumed_sweep_equals_an_uninterrupted_one(tiny_dir, tmp_path):
    kill_and_resume(tiny_dir, tmp_path)


@pytest.mark.slow
def test_a_killed_and_resumed_smollm2_sweep_equals_an_uninterrupted_one(tmp_path):
    """The reported case: SmolLM2-135M on 8 PIQA questions."""
    kill_and_resume("smollm2-135m", tmp_path)
