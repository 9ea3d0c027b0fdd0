"""Ray started by the sweep itself (no cluster given): as many workers as this machine's CPUs
allow, and a score registered in user code (tests/integration/ray_user_scores.py) reaches them
through ``SweepConfig.imports``. Its own module, so that no other test's Ray session is running."""

import json
import math
import os
import sys

import pytest
import torch

from inactive_heads.scoring import scores as score_registry
from inactive_heads.sweep.run import run_sweep
from inactive_heads.sweep.runner import VOLATILE_FIELDS, SweepConfig

pytestmark = pytest.mark.slow  # Ray's start and two model loads: minutes on 2 CPU cores

ray = pytest.importorskip("ray")


def stable(records):
    return {k: {f: v for f, v in r.items() if f not in VOLATILE_FIELDS} for k, r in records.items()}


@pytest.fixture
def user_scores(monkeypatch):
    """The user module imported afresh into a registry that is restored afterwards."""
    monkeypatch.setattr(score_registry, "_REGISTRY", dict(score_registry._REGISTRY))
    sys.modules.pop("ray_user_scores", None)
    yield "ray_user_scores"
    sys.modules.pop("ray_user_scores", None)


def test_embedded_ray_fills_the_machine_and_its_workers_import_user_scores(user_scores, smollm2_hooked, tmp_path):
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
        local = run_sweep(config, tmp_path / "local", model=smollm2_hooked, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert stable(remote.records) == stable(local.records)
    assert remote.records["user_max_key_weight@p=0.3"]["realized_fraction"] > 0
    assert torch.equal(remote.head_scores()["user_max_key_weight"], local.head_scores()["user_max_key_weight"])
