"""A sweep on Ray whose driver is SIGKILLed at several points of its progress and resumed until
done writes the same records, to the byte (timings aside), as one that ran without interruption
(issue 47): the local case's test (test_sweep_resume.py) with ``--executor ray``.

Each kill is a real ``SIGKILL`` of the ``inactive-heads sweep`` driver, then of its process group
(the embedded Ray it started): in the middle of the baseline (one of its two shards written, the
record not yet assembled), after the scores, and after an ablated run's record. The resumed
driver starts a new embedded Ray and takes the finished shards and records from the folder. Run
in the Ray phase of ``make test`` (Ray's workers need the cores).
"""

import pytest
from test_sweep_resume import kill_and_resume
from tiny import save_tiny_llama_with_smollm2_tokenizer

pytest.importorskip("ray")

# the first shard file the driver writes is the baseline's shard 0 (shards/baseline/0.json)
KILL_AFTER = ("0.json", "scores.safetensors", "ahon_ln@p=0.1.json")
# one actor, batches of 2: the 8 PIQA questions' 16 inputs make 8 batches, 2 shards a run
RAY = ("--executor", "ray", "--workers", "1", "--batch-size", "2")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama_with_smollm2_tokenizer(tmp_path_factory.mktemp("tiny-llama"))


def test_a_killed_and_resumed_ray_sweep_equals_an_uninterrupted_one(tiny_dir, tmp_path):
    kill_and_resume(tiny_dir, tmp_path, kill_after=KILL_AFTER, extra=RAY)
    assert (tmp_path / "resumed" / "shards" / "baseline" / "1.json").is_file()  # the run went by shards
