"""The Ray executor on real SmolLM2 + MMLU (tiny): records identical to the local executor's, also
when a worker is killed mid-task and replaced; an interrupted driver resumes at shard granularity.
GSM8K (3 questions, 4 new tokens) in both decision modes: records and thresholds identical too.

First, Ray started by the sweep itself (no cluster given): as many workers as this machine's CPUs
allow, and a score registered in user code (tests/integration/ray_user_scores.py) reaches them
through ``SweepConfig.imports``; it runs before any other test here starts Ray, and so does a
sweep of an ablation kind registered in user code (tests/integration/user_ablation.py), and a sweep of
a task registered in user code (tests/integration/user_task.py). Then one embedded
Ray instance (2 CPUs) is shared by the rest of the module; Ray's start-up dominates the cost.
Every Ray test is in this one file, so that two Ray instances never run at once; make test runs it
alone, after the other files (which run in parallel processes)."""

import json
import math
import os
import sys

import pytest
import torch

from inactive_heads.core.errors import UserError
from inactive_heads.scoring import scores as score_registry
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.executors import ray as distributed
from inactive_heads.sweep.run import run_sweep

pytestmark = pytest.mark.slow  # minutes on 2 CPU cores (tests/conftest.py)

ray = pytest.importorskip("ray")


@pytest.fixture
def user_task():
    """The user task's module (tests/integration/user_task.py) imported, its task unregistered afterwards."""
    import user_task as module

    yield module
    from inactive_heads import unregister_task

    unregister_task(module.NAME)
    sys.modules.pop("user_task", None)


def tiny_config(**overrides):
    base = dict(model="smollm2-135m", task="mmlu", subjects=["abstract_algebra", "anatomy"], limit=3, num_fewshot=0,
                scores=["ahon_ln"], quantiles=[0.0, 0.3], batch_size=2)
    base.update(overrides)
    return SweepConfig(**base)


def stable(records):
    return {k: r.without_volatile() for k, r in records.items()}


@pytest.fixture
def crash_once(monkeypatch, tmp_path):
    """Fault injection: ``crash_once(run id, shard)`` makes the worker that runs that shard exit
    mid-task once, as a lost machine would; returns the marker file that records that it did.
    The executor's actors are made from a subclass of its Worker defined here (``ray.remote`` is
    wrapped for the test; Ray ships the subclass to the actors by value, the Worker by reference).
    On a restart the marker stops a second crash."""

    def arm(rid, shard):
        marker = str(tmp_path / "crashed")
        worker = distributed.Worker

        class CrashingWorker(worker):
            def run_shard(self, run, part, *args):
                if (run, part) == (rid, shard) and not os.path.exists(marker):
                    with open(marker, "w") as f:
                        f.write(str(os.getpid()))
                    os._exit(1)  # the process dies mid-task
                return worker.run_shard(self, run, part, *args)

        real_remote = ray.remote
        monkeypatch.setattr(ray, "remote", lambda cls, *a, **k: real_remote(CrashingWorker if cls is worker else cls,
                                                                             *a, **k))
        return tmp_path / "crashed"

    return arm


@pytest.fixture
def user_scores(monkeypatch):
    """The user module imported afresh into a registry that is restored afterwards."""
    monkeypatch.setattr(score_registry, "_REGISTRY", dict(score_registry._REGISTRY))
    sys.modules.pop("ray_user_scores", None)
    yield "ray_user_scores"
    sys.modules.pop("ray_user_scores", None)


def test_embedded_ray_fills_the_machine_and_its_workers_import_user_scores(user_scores, smollm2, tmp_path):
    assert not ray.is_initialized()
    config = SweepConfig(model="smollm2-135m", task="mmlu", subjects=["abstract_algebra", "anatomy"], limit=3,
                         num_fewshot=0, scores=["user_max_key_weight"], quantiles=[0.3], include_random=False,
                         batch_size=1, imports=[user_scores])
    remote = run_sweep(config, tmp_path / "ray", executor="ray", progress=False)
    assert not ray.is_initialized()  # the sweep started Ray, so it stopped it
    # 6 inputs in batches of 1; the default pool is os.cpu_count() one-thread workers, and the layout
    # asks for two shards per worker: blocks of ceil(6 / (2 * workers)) batches (1 worker: 2 shards)
    workers = os.cpu_count() or 1
    layout = json.loads((tmp_path / "ray" / "shards" / "layout.json").read_text())
    assert len(layout) == math.ceil(6 / math.ceil(6 / (2 * workers)))
    assert json.loads((tmp_path / "ray" / "sweep.json").read_text())["imports"] == [user_scores]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run (fp32 sums are ordered by the thread count)
    try:
        local = run_sweep(config, tmp_path / "local", model=smollm2, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert stable(remote.records) == stable(local.records)
    assert remote.records["user_max_key_weight@p=0.3"].realized_fraction > 0
    assert torch.equal(remote.head_scores()["user_max_key_weight"], local.head_scores()["user_max_key_weight"])


def test_a_users_ablation_kind_on_ray_equals_the_local_sweep(smollm2, tmp_path):
    # tests/integration/user_ablation.py registers the kind; the workers know it only through imports
    assert not ray.is_initialized()
    spec = {"kind": "zero_listed_heads", "heads": [[0, 1], [4, 8], [29, 3]]}
    config = tiny_config(scores=[], include_random=False, imports=["user_ablation"], ablations=[spec])
    remote = run_sweep(config, tmp_path / "ray", executor="ray", workers=1, shards=2, progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run
    try:
        local = run_sweep(config, tmp_path / "local", model=smollm2, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert stable(remote.records) == stable(local.records)
    (rid,) = remote.ablation_keys
    assert remote.records[rid].ablation == spec and remote.records[rid].realized_fraction == 3 / 270
    assert remote.records[rid].loglikelihoods != remote.records["baseline"].loglikelihoods


def test_a_user_task_on_ray_equals_the_local_sweep_and_the_hand_computation(user_task, tmp_path):
    # The workers know the task only by importing its module (imports); a tiny Llama loaded by path.
    from reference_user_task import outcomes_by_hand, tiny_llama_dir

    assert not ray.is_initialized()
    model_dir = tiny_llama_dir(tmp_path / "tiny")
    config = SweepConfig(model=model_dir, task=user_task.NAME, scores=["ahon_ln"], quantiles=[0.0, 0.3],
                         dtype="float32", batch_size=2, imports=["user_task"])
    remote = run_sweep(config, tmp_path / "ray", executor="ray", workers=1, shards=2, progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run
    try:
        local = run_sweep(config, tmp_path / "local", progress=False)
    finally:
        torch.set_num_threads(threads)
    assert stable(remote.records) == stable(local.records)
    correct, correct_norm = outcomes_by_hand(model_dir, user_task.DOCS["test"])
    assert remote.records["baseline"].correct == correct
    assert remote.records["baseline"].correct_norm == correct_norm
    assert remote.records["ahon_ln@p=0.3"].realized_fraction > 0


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local(smollm2, tmp_path_factory):
    # Actors run one torch thread each; fp32 reductions (log_softmax over the vocabulary, norms) sum
    # in an order that depends on the thread count, so the local reference runs with one thread too.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_sweep(tiny_config(), tmp_path_factory.mktemp("local"), model=smollm2, progress=False)
    finally:
        torch.set_num_threads(threads)


def test_ray_records_equal_local_records_even_when_a_worker_dies_mid_task(ray_session, local, tmp_path, crash_once):
    marker = crash_once("ahon_ln@p=0.3", 1)
    # one worker: the sweep can only finish if the dead actor is replaced and its task re-run
    remote = run_sweep(tiny_config(), tmp_path / "sweep", executor="ray", workers=1, shards=3, progress=False)
    assert marker.is_file()  # the worker process did exit in the middle of that task
    layout = json.loads((tmp_path / "sweep" / "shards" / "layout.json").read_text())
    assert len(layout) == 3 and sorted(sum(layout, [])) == list(range(6))  # 3 batches of 2 -> 3 shards
    assert set(remote.records) == set(local.records) and len(remote.records) == 5
    a, b = stable(local.records), stable(remote.records)
    for rid in a:
        for field in ("accuracy", "correct", "loglikelihoods", "realized_fraction", "realized_fraction_per_layer",
                      "oracle_savings"):
            assert a[rid].get(field) == b[rid].get(field), (rid, field)
    assert a == b
    assert remote.records["ahon_ln@p=0.3"].realized_fraction > 0
    assert remote.records["ahon_ln@p=0.3"].oracle_savings["query_heads_pct"] > 0
    assert 0 < remote.records["random@p=0.3"].realized_fraction < 0.6
    for key in ("ahon_ln",):
        assert torch.equal(remote.head_scores()[key], local.head_scores()[key])
    assert (tmp_path / "sweep" / "runs.parquet").is_file() and not (tmp_path / "sweep" / ".lock").exists()


def test_an_interrupted_driver_resumes_at_shard_granularity(ray_session, local, tmp_path, monkeypatch):
    real = distributed._write_shard
    written = []

    def interrupt_after_four(out, part):
        if len(written) == 4:
            raise KeyboardInterrupt
        written.append((part["run_id"], part["shard"]))
        real(out, part)

    monkeypatch.setattr(distributed, "_write_shard", interrupt_after_four)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny_config(), tmp_path, executor="ray", workers=1, shards=3, progress=False)
    assert len(written) == 4 and not (tmp_path / ".lock").exists()
    records = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    assert "baseline.json" in records  # the 3 baseline shards were in, so its record was assembled

    rewritten = []

    def counting(out, part):
        rewritten.append((part["run_id"], part["shard"]))
        real(out, part)

    monkeypatch.setattr(distributed, "_write_shard", counting)
    resumed = run_sweep(tiny_config(), tmp_path, executor="ray", workers=1, progress=False)
    assert not set(rewritten) & set(written)  # no finished shard ran again
    assert len(rewritten) + len(written) == 3 * 3  # baseline + ahon_ln@0.3 + random@0.3, 3 shards each
    for name, mtime in records.items():  # no record written twice
        assert (tmp_path / "runs" / name).stat().st_mtime_ns == mtime
    assert stable(resumed.records) == stable(local.records)


def test_workers_that_cannot_be_placed_fail_in_one_line_within_the_wait(ray_session, tmp_path, monkeypatch):
    """The session has 2 CPUs and no GPU: 3 one-thread workers, or a GPU per worker, never fit."""
    import time

    monkeypatch.setattr(distributed, "PLACEMENT_TIMEOUT_S", 2.0)
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        run_sweep(tiny_config(), tmp_path / "a", executor="ray", workers=3, progress=False)
    assert time.monotonic() - start < 60
    message = str(err.value)
    assert "could not place 3 worker(s) of 1 CPU thread(s) each within 2 s" in message and "\n" not in message
    assert "the cluster has 2 CPU(s) and 0 GPU(s)" in message
    with pytest.raises(UserError, match=r"not enough for one worker of 1 CPU thread\(s\) and 1 GPU\(s\)"):
        run_sweep(tiny_config(), tmp_path / "b", executor="ray", gpus_per_worker=1.0, progress=False)
    with pytest.raises(UserError, match=r"could not place 2 worker\(s\) of 1 CPU thread\(s\) and 1 GPU\(s\) each"):
        run_sweep(tiny_config(), tmp_path / "c", executor="ray", workers=2, gpus_per_worker=1.0, progress=False)
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())  # nothing held


def gsm8k_config(decision):
    # 3 questions, 0 shots, 4 new tokens (as test_sweep_gsm8k.py keeps generation short); batches of
    # one question, so 2 shards hold 2 questions and 1: fractions averaged per shard would be off.
    return SweepConfig(model="smollm2-135m", task="gsm8k", limit=3, num_fewshot=0, max_gen_toks=4,
                       scores=["ahon_ln"], quantiles=[0.3], batch_size=1, decision=decision)


@pytest.mark.parametrize("decision", ["per_step", "prompt"])
def test_a_gsm8k_sweep_on_ray_equals_the_local_sweep(ray_session, smollm2, tmp_path, decision):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run
    try:
        local = run_sweep(gsm8k_config(decision), tmp_path / "local", model=smollm2, progress=False)
    finally:
        torch.set_num_threads(threads)
    remote = run_sweep(gsm8k_config(decision), tmp_path / "ray", executor="ray", workers=1, shards=2, progress=False)
    layout = json.loads((tmp_path / "ray" / "shards" / "layout.json").read_text())
    assert sorted(map(len, layout)) == [1, 2] and sorted(sum(layout, [])) == [0, 1, 2]
    assert layout[0] != [0, 1]  # the prompts' batch order (longest first), not question order
    # the shards' scores, pooled, are the local scores to the bit, and so are the thresholds
    assert torch.equal(remote.head_scores()["ahon_ln"], local.head_scores()["ahon_ln"])
    assert {k: t.to_dict() for k, t in remote.thresholds.items()} == \
        {k: t.to_dict() for k, t in local.thresholds.items()}
    a, b = stable(local.records), stable(remote.records)
    assert set(a) == set(b) == {"baseline", "ahon_ln@p=0.3", "random@p=0.3"}
    for rid in a:
        for field in ("generations", "answers", "correct", "correct_flexible", "realized_fraction",
                      "realized_fraction_per_layer", "realized_fraction_prompts", "n_generated_tokens",
                      "n_forward_sequences", "savings", "accuracy"):
            assert a[rid][field] == b[rid][field], (rid, field)
    assert a == b
    for rid in ("ahon_ln@p=0.3", "random@p=0.3"):  # both zeroed heads (Random seeded by the global ids)
        assert remote.records[rid].realized_fraction > 0 and remote.records[rid].decision == decision
    if decision == "prompt":
        assert remote.records["ahon_ln@p=0.3"].savings["decode_flops_saved_fraction"] > 0
