"""What a sweep folder's identity is (``sweep.json``), and what a resume may change: no model runs
here; folders are written by hand as the executors write them."""

import json
import re
import sys

import pytest
import torch

from inactive_heads.core.errors import UserError
from inactive_heads.scoring import scores as score_registry
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.executors.ray import _pack_flags, merge_generation_shards, pool_size
from inactive_heads.sweep.folder import check_folder, prepare_folder, stored_config


def config(**overrides):
    base = {"model": "smollm2-135m", "task": "piqa", "limit": 4, "scores": ["ahon_ln"], "quantiles": [0.0, 0.3]}
    base.update(overrides)
    return SweepConfig(**base).validate()


def write_record(out, rid, dtype, device):
    (out / "runs").mkdir(parents=True, exist_ok=True)
    score, p = (None, None) if rid == "baseline" else (rid.split("@p=")[0], float(rid.split("@p=")[1]))
    (out / "runs" / f"{rid}.json").write_text(json.dumps({"run_id": rid, "score": score, "p": p, "dtype": dtype,
                                                          "device": device}))


def test_sweep_json_stores_the_resolved_dtype_and_the_device_type(tmp_path):
    wanted = config(dtype="auto", device="cuda:1")
    prepare_folder(wanted.resolved(dtype="bfloat16", device="cuda:1"), tmp_path)
    stored = json.loads((tmp_path / "sweep.json").read_text())
    assert (stored["dtype"], stored["device"]) == ("bfloat16", "cuda")
    assert stored.pop("format_version") == 3
    assert stored.pop("score_info") == {"ahon_ln": {"label": "AHON (LN)", "direction": "below",
                                                    "reads": ["z"]},
                                        "random": {"label": "Random", "direction": "below", "reads": []}}
    assert SweepConfig.from_dict(stored) == config(dtype="bfloat16", device="cuda")
    with pytest.raises(ValueError, match="needs a resolved config"):
        prepare_folder(config(dtype="auto", device="cpu"), tmp_path / "other")
    with pytest.raises(ValueError, match="needs a resolved config"):
        prepare_folder(config(dtype="float32", device=None), tmp_path / "other")


def test_a_resume_in_another_dtype_or_device_type_is_refused_in_one_line(tmp_path):
    prepare_folder(config(dtype="bfloat16", device="cuda"), tmp_path)
    for dtype, device in (("float32", "cuda"), ("bfloat16", "cpu"), ("float32", "cpu")):
        with pytest.raises(UserError) as err:
            prepare_folder(config(dtype=dtype, device=device), tmp_path)
        message = str(err.value)
        assert "computed in bfloat16 on cuda" in message and f"would compute in {dtype} on {device}" in message
        assert "--dtype bfloat16 --device cuda" in message and "\n" not in message
    # the folder still says what it holds
    assert json.loads((tmp_path / "sweep.json").read_text())["dtype"] == "bfloat16"


def test_batch_size_and_device_index_are_not_part_of_the_identity(tmp_path):
    prepare_folder(config(dtype="float32", device="cuda:0", batch_size=8), tmp_path)
    prepare_folder(config(dtype="float32", device="cuda:1", batch_size=3), tmp_path)
    assert json.loads((tmp_path / "sweep.json").read_text())["batch_size"] == 3  # the config that last ran


def test_before_the_model_loads_only_what_is_settled_is_compared(tmp_path):
    prepare_folder(config(dtype="bfloat16", device="cuda"), tmp_path)
    check_folder(config(dtype="auto", device=None), tmp_path)  # settled once the model has loaded
    with pytest.raises(UserError, match="computed in bfloat16 on cuda, this run would compute in float32"):
        check_folder(config(dtype="float32", device=None), tmp_path)
    with pytest.raises(UserError, match="differs in limit"):
        check_folder(config(dtype="auto", limit=5), tmp_path)  # other options: as before


def test_sweep_json_of_earlier_versions_is_settled_by_its_records(tmp_path):
    """sweep.json files written with dtype "auto" and device null: the records say what ran."""
    legacy = {**config().to_dict(), "dtype": "auto", "device": None}
    del legacy["imports"]  # earlier versions had no such option
    (tmp_path / "sweep.json").write_text(json.dumps(legacy))
    assert stored_config(tmp_path).dtype == "auto"  # nothing ran yet: settled by the first model
    prepare_folder(config(dtype="float32", device="cpu"), tmp_path)  # and written resolved
    assert json.loads((tmp_path / "sweep.json").read_text())["dtype"] == "float32"

    (tmp_path / "sweep.json").write_text(json.dumps(legacy))
    write_record(tmp_path, "baseline", "bfloat16", "cuda:0")
    assert (stored_config(tmp_path).dtype, stored_config(tmp_path).device) == ("bfloat16", "cuda")
    with pytest.raises(UserError, match="computed in bfloat16 on cuda, this run would compute in float32 on cpu"):
        prepare_folder(config(dtype="float32", device="cpu"), tmp_path)
    prepare_folder(config(dtype="bfloat16", device="cuda:1"), tmp_path)
    assert json.loads((tmp_path / "sweep.json").read_text())["device"] == "cuda"


def test_a_folder_of_mixed_precisions_cannot_be_resumed(tmp_path):
    """The bug of earlier versions: a bf16 GPU sweep resumed on a CPU ran the rest in fp32."""
    (tmp_path / "sweep.json").write_text(json.dumps({**config().to_dict(), "dtype": "auto", "device": None}))
    write_record(tmp_path, "baseline", "bfloat16", "cuda:0")
    write_record(tmp_path, "ahon_ln@p=0.3", "float32", "cpu")
    with pytest.raises(UserError) as err:
        check_folder(config(dtype="auto"), tmp_path)
    assert "bfloat16 on cuda and in float32 on cpu" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's that registers a score, importable under a fresh name."""
    name = f"user_scores_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        "import inactive_heads as ih\n\n"
        "@ih.register_score('max_key_weight_user', reads=('pattern',), direction='above')\n"
        "def max_key_weight(acts):\n"
        "    return acts.mean_over_queries(acts.pattern.amax(dim=-1))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(score_registry, "_REGISTRY", dict(score_registry._REGISTRY))
    yield name
    sys.modules.pop(name, None)


def test_imports_register_user_scores_before_the_scores_are_checked(user_module):
    with pytest.raises(KeyError, match="unknown score 'max_key_weight_user'"):
        config(scores=["max_key_weight_user"])
    plain = SweepConfig(scores=["max_key_weight_user"], imports=[user_module])  # plain data: imports nothing
    assert user_module not in sys.modules and SweepConfig.from_dict(plain.to_dict()) == plain
    assert user_module not in sys.modules
    cfg = config(scores=["max_key_weight_user"], imports=[user_module])
    assert user_module in sys.modules
    assert SweepConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(UserError, match="cannot import module 'no_such_module_xyz'"):
        config(imports=["no_such_module_xyz"])
    with pytest.raises(UserError, match="imports must be a list of module names"):
        config(imports=[""])


def test_the_cli_passes_import_to_the_config(user_module):
    from inactive_heads.cli import build_parser
    from inactive_heads.cli.sweeps import sweep_config as _sweep_config

    args = build_parser().parse_args(["sweep", "--out", "x", "--scores", "max_key_weight_user",
                                      "--import", user_module, "--import", "json"])
    assert _sweep_config(args).imports == [user_module, "json"]


@pytest.mark.parametrize(
    "resources, workers, threads, gpus, expected",
    [
        ({"CPU": 16.0}, None, 1, 0.0, 16),
        ({"CPU": 16.0}, None, 3, 0.0, 5),
        ({"CPU": 16.0, "GPU": 4.0}, None, 1, 1.0, 4),  # one per GPU
        ({"CPU": 16.0, "GPU": 4.0}, None, 1, 0.5, 8),
        ({"CPU": 2.0, "GPU": 4.0}, None, 1, 1.0, 2),  # each GPU worker also holds its CPU threads
        ({"CPU": 2.0}, 5, 1, 0.0, 5),  # asked for: placement decides (and fails in bounded time)
    ],
)
def test_the_default_ray_pool_fills_the_cluster(resources, workers, threads, gpus, expected):
    assert pool_size(resources, workers, threads, gpus) == expected


def test_a_pool_that_cannot_hold_one_worker_is_one_line():
    with pytest.raises(UserError, match=r"has 8 CPU\(s\) and 0 GPU\(s\): not enough for one worker of "
                                        r"1 CPU thread\(s\) and 1 GPU\(s\)"):
        pool_size({"CPU": 8.0}, None, 1, 1.0)


def test_generation_shards_merge_their_counts_not_their_fractions():
    """Prompt mode, 2 layers x 2 heads, questions 0..2 in two shards of unequal size. Held heads
    (layer: heads) and generated tokens: q0 {0: [0], 1: [1]} x 2 tokens; q1 {1: [0]} x 2;
    q2 {0: [0, 1]} x 4. Per forward pass the zeroed heads are 2·2 + 1·2 + 2·4 = 14 of 8 passes x 4
    heads: 14/32, layer 0: 10/16, layer 1: 4/16. Averaging the shards' own fractions (12/24 and
    2/8) would give 0.375 instead."""
    flags = {0: [[1, 0], [0, 1]], 1: [[0, 0], [1, 0]], 2: [[1, 1], [0, 0]]}
    tokens = {0: 2, 1: 2, 2: 4}

    def shard(inputs, zeroed, zeroed_prompts):
        return {"inputs": inputs, "generations": [f"text {i}" for i in inputs],
                "answers": [{"strict-match": str(i)} for i in inputs], "correct": [i == 1 for i in inputs],
                "correct_flexible": [i != 0 for i in inputs], "n_generated_per_question": [tokens[i] for i in inputs],
                "n_forward_passes": sum(tokens[i] for i in inputs), "use_cache": True, "seconds": 1.25,
                "zeroed": zeroed, "zeroed_prompts": zeroed_prompts,
                "flagged": _pack_flags(torch.tensor([flags[i] for i in inputs], dtype=torch.bool))}

    # the shards' counts, by hand: zeroed heads per layer over passes (tokens x heads) and over prompts
    parts = [shard([2, 0], {"n_sequences": 6, "flagged_per_layer": [4 * 2 + 2 * 1, 2 * 1]},
                   {"n_sequences": 2, "flagged_per_layer": [3, 1]}),
             shard([1], {"n_sequences": 2, "flagged_per_layer": [0, 2 * 1]},
                   {"n_sequences": 1, "flagged_per_layer": [0, 1]})]
    merged = merge_generation_shards(parts, n_layers=2, n_heads=2)
    assert merged["zeroed"].realized_fraction == 14 / 32
    assert merged["zeroed"].realized_fraction_per_layer == [10 / 16, 4 / 16]
    assert merged["zeroed_prompts"].realized_fraction == 5 / 12  # 5 of 3 prompts x 4 heads
    assert merged["generations"] == ["text 0", "text 1", "text 2"]  # back in question order
    assert merged["correct"] == [False, True, False] and merged["correct_flexible"] == [False, True, True]
    assert merged["n_generated_per_question"] == [2, 2, 4] and merged["n_forward_passes"] == 8
    assert merged["flagged"].tolist() == [[[True, False], [False, True]], [[False, False], [True, False]],
                                          [[True, True], [False, False]]]
    assert (merged["seconds"], merged["use_cache"]) == (2.5, True)


def test_generation_options_are_checked_in_one_line():
    assert SweepConfig(task="gsm8k").validate().decision == "per_step"  # the authors' protocol, in sweep.json
    assert SweepConfig(task="gsm8k", reuse_prefix=True).validate().reuse_prefix  # per_step: the prefix once
    for options, message in (
        ({"task": "gsm8k", "decision": "per_token"}, "unknown decision 'per_token'; use one of per_step, prompt"),
        ({"task": "mmlu", "decision": "prompt"}, "apply to generation tasks (gsm8k) only"),
        ({"task": "piqa", "max_gen_toks": 32}, "apply to generation tasks (gsm8k) only"),
        ({"task": "gsm8k", "max_gen_toks": 0}, "max_gen_toks must be a positive integer, got 0"),
        ({"task": "gsm8k", "attention": "fast"}, "attention apply to log-likelihood tasks only"),
        ({"task": "gsm8k", "decision": "prompt", "reuse_prefix": True},
         "reuse_prefix applies to decision 'per_step' in generation tasks, got decision 'prompt'"),
    ):
        with pytest.raises(UserError, match=re.escape(message)):
            SweepConfig(**options).validate()


def test_the_cli_passes_the_generation_options_to_the_config():
    from inactive_heads.cli import build_parser
    from inactive_heads.cli.sweeps import sweep_config as _sweep_config

    args = build_parser().parse_args(["sweep", "--task", "gsm8k", "--decision", "prompt", "--max-gen-toks", "64",
                                      "--out", "x"])
    config = _sweep_config(args)
    assert (config.task, config.decision, config.max_gen_toks) == ("gsm8k", "prompt", 64)


def test_static_options_are_checked_in_one_line():
    from inactive_heads.sweep.run import run_sweep

    ok = SweepConfig(task="piqa", limit=100, quantiles=[0.0, 0.1], static_rule="mean",
                     static_calibration=[100, 200]).validate()
    assert [rid for rid, _, _ in ok.run_ids() if "@static" in rid][:1] == ["awft@static@p=0.1"]
    assert not [rid for rid, _, _ in ok.run_ids() if "@static@p=0.0" in rid]
    for options, message in (
        ({"static_rule": "median", "static_calibration": [100, 200], "limit": 50}, "unknown static_rule 'median'"),
        ({"static_rule": "mean", "limit": 50}, "static_calibration must be [first, end)"),
        ({"static_rule": "mean", "static_calibration": [200, 100], "limit": 50}, "static_calibration must be"),
        ({"static_rule": "mean", "static_calibration": [100, 200]}, "set limit <= 100"),
        ({"static_rule": "mean", "static_calibration": [100, 200], "limit": 150}, "set limit <= 100"),
        ({"static_calibration": [100, 200], "limit": 50}, "static_calibration needs static_rule"),
        ({"static_rule": "mean", "static_calibration": [100, 200], "limit": 50, "quantiles": [0.0]}, "p > 0"),
        ({"task": "gsm8k", "static_rule": "mean", "static_calibration": [100, 200], "limit": 50},
         "built-in multiple-choice tasks"),
    ):
        with pytest.raises(UserError, match=re.escape(message)):
            SweepConfig(**options).validate()
    with pytest.raises(UserError, match="local executor only"):
        run_sweep(ok, "unused-folder", executor="ray")


def test_every_executor_runs_a_pass_through_the_one_pass_function():
    """Only sweep/passes.py (evaluate_run) calls the evaluators: the local executor and the Ray
    shards configure a pass in one place (the records of both executors are compared bit for bit
    in tests/integration/test_distributed.py)."""
    import ast
    from pathlib import Path

    import inactive_heads.sweep as sweep

    evaluators = {"evaluate", "evaluate_generation", "generate"}
    callers = set()
    for path in Path(sweep.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(("evaluator", "generation")):
                if evaluators & {a.name for a in node.names}:
                    callers.add(path.name)
            if isinstance(node, ast.Attribute) and node.attr in evaluators:
                callers.add(path.name)
    assert callers == {"passes.py"}
