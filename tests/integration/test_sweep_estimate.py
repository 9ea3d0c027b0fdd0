"""A sweep's estimate against the sweep itself (SmolLM2, real MMLU, a tiny shape).

The counts are the testable part: the forward batches and padded tokens the estimate projects
equal those the real sweep feeds the model's embedding, counted by a hook on it (another source
than the estimator's arithmetic on the plan). The timing ratio is a benchmark figure
(docs/sweeps.md), not asserted here.
"""

import json

import pytest

from inactive_heads.cli import main
from inactive_heads.models.tl_line import is_hooked_transformer
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.estimate import estimate_sweep
from inactive_heads.sweep.run import run_sweep


def small_config(**overrides):
    base = dict(model="smollm2-135m", task="mmlu", subjects=["abstract_algebra", "anatomy"], limit=3,
                num_fewshot=0, scores=["ahon_ln", "awft"], quantiles=[0.0, 0.3], batch_size=4)
    return SweepConfig(**{**base, **overrides})


def embedding_of(model):
    return model.embed if is_hooked_transformer(model) else model.original_model.get_input_embeddings()


class Counter:
    """Every forward call of the embedding: one batch, rows x width padded tokens."""

    def __init__(self, module):
        self.batches, self.padded = 0, 0
        self.handle = module.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.batches += 1
        self.padded += args[0].numel()


def test_estimate_counts_the_passes_and_tokens_the_sweep_runs(smollm2, tmp_path):
    out = tmp_path / "sweep"
    estimate = estimate_sweep(small_config(), out, model=smollm2)
    assert not out.exists()  # the estimate writes nothing
    p = estimate.projection
    # baseline + {ahon_ln, awft, random} at p = 0.3 run; the three p = 0 runs reuse the baseline
    assert p["passes"] == {"baseline": 1, "records_scores": True, "ablated": 3, "reused": 3}
    # 2 subjects x 3 questions, one forward input each (MMLU), batches of 4: 2 batches per pass
    assert p["work"]["baseline"]["inputs"] == 6 and p["work"]["baseline"]["batches"] == 2
    assert p["work"]["total"]["batches"] == 4 * 2
    counter = Counter(embedding_of(smollm2))
    try:
        results = run_sweep(small_config(), out, model=smollm2, progress=False)
    finally:
        counter.handle.remove()
    ran = [r for r in results.records.values() if r.reused_from is None]
    assert len(ran) == 1 + p["passes"]["ablated"]
    assert sum(1 for r in results.records.values() if r.reused_from is not None) == p["passes"]["reused"]
    assert counter.batches == p["work"]["total"]["batches"]
    assert counter.padded == p["work"]["total"]["padded_tokens"]
    assert estimate.peak_bytes > 100 * 2**20  # the weights alone are ~0.5 GB in float32
    parts = p["seconds_by_part"]
    assert parts["load_model"] == 0  # the model was passed in
    assert estimate.seconds == pytest.approx(sum(parts.values()), abs=0.1)


def test_estimate_of_a_finished_sweep_counts_nothing_left(smollm2, tmp_path):
    config = small_config(quantiles=[0.0], include_random=False)
    run_sweep(config, tmp_path, model=smollm2, progress=False)
    before = sorted((f.name, f.stat().st_mtime_ns) for f in tmp_path.rglob("*"))
    estimate = estimate_sweep(small_config(quantiles=[0.0], include_random=False), tmp_path, model=smollm2)
    assert estimate.projection["passes"] == {"baseline": 0, "records_scores": False, "ablated": 0, "reused": 0}
    assert estimate.projection["work"]["total"]["padded_tokens"] == 0
    assert sorted((f.name, f.stat().st_mtime_ns) for f in tmp_path.rglob("*")) == before


def test_sweep_estimate_json_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["sweep", "--task", "mmlu", "--subjects", "anatomy", "--limit", "2", "--num-fewshot", "0",
                 "--scores", "awft", "--quantiles", "0.1", "--no-random", "--batch-size", "2",
                 "--out", str(out), "--estimate", "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) == {"seconds", "peak_bytes", "projection"}
    assert printed["projection"]["passes"]["ablated"] == 1
    assert printed["projection"]["work"]["total"]["inputs"] == 2 * 2  # baseline + one run, 2 questions each
    assert not out.exists()


def test_generation_estimate_counts_prompts(smollm2, tmp_path):
    config = SweepConfig(model="smollm2-135m", task="gsm8k", limit=2, num_fewshot=0, scores=["awft"],
                         quantiles=[0.3], include_random=False, batch_size=2, max_gen_toks=2)
    estimate = estimate_sweep(config, tmp_path / "gsm8k", model=smollm2)
    p = estimate.projection
    # generation runs never reuse the baseline: baseline + awft@p=0.3, 2 prompts each
    assert p["passes"] == {"baseline": 1, "records_scores": True, "ablated": 1, "reused": 0}
    assert p["work"]["prompts_per_pass"]["inputs"] == 2 and p["work"]["total"]["inputs"] == 2 * 2
    assert p["sample"]["prompts"] == 2 and p["sample"]["generated_tokens_baseline"] <= 2 * 2
    assert set(p["seconds_per_prompt"]) == {"baseline", "ablated"}
    assert not (tmp_path / "gsm8k").exists()
