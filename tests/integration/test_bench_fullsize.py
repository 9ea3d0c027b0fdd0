"""benchmarks/bench_fullsize.py runs its whole path at a tiny shape on the CPU (float32): every
stage in one process, and its numerics against Hugging Face's own forward hold.

The references are independent of the toolkit: Hugging Face's model class run on the same weight
tensors (with heads zeroed by ``o_proj`` pre-hooks for the ablated pass), the loop-by-loop score
reference, and the exported checkpoint's own ``config.json`` read by ``transformers``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fullsize.py"
STAGES = ["load", "scores", "evaluate", "generate", "check", "export", "fp32"]


def _run(tmp_path, config: dict, *extra: str) -> dict:
    shape = tmp_path / "shape"
    shape.mkdir()
    (shape / "config.json").write_text(json.dumps(config))
    cmd = [sys.executable, str(SCRIPT), "--shape", str(shape), "--dir", str(tmp_path / "model"), "--dtype", "float32",
           "--n-seq", "2", "--seq-len", "48", "--questions", "2", "--prompt-len", "16", "--new-tokens", "3",
           "--check-len", "12", "--threads", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_numerics(figures: dict) -> None:
    assert figures["ablated_heads"] > 0 and figures["ablated_changed_logits_by"] > 1e-3  # the ablation did something
    assert figures["logits_rel_diff"] <= 1e-4 and figures["argmax_equal"]
    assert figures["ablated_logits_rel_diff"] <= 1e-4
    assert figures["scores_max_abs_diff"] <= 1e-4


def _check_bfloat16(figures: dict) -> None:
    """Hugging Face's own bfloat16 rounding on the cut is far above the float32 equalities, and the
    toolkit's bfloat16 logits are no further from Hugging Face's float32 logits than Hugging Face's
    bfloat16 logits are (within a factor 2: the two round differently where their arithmetic
    differs, e.g. rotary embeddings applied in float32 by TransformerLens's own attention)."""
    hf, ours = figures["hf_bf16_vs_fp32_rel_diff"], figures["ours_bf16_vs_fp32_rel_diff"]
    assert hf > 1e-4
    assert 0 < ours <= 2 * hf, figures


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bench_fullsize_runs_every_stage_and_equals_hugging_face(tmp_path, family):
    from transformers import AutoConfig

    config = {"architectures": ["Qwen2ForCausalLM" if family == "qwen2" else "LlamaForCausalLM"],
              "model_type": family, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "num_hidden_layers": 3, "vocab_size": 300,
              "max_position_embeddings": 4096, "tie_word_embeddings": False}
    summary = _run(tmp_path, config)
    assert list(summary["stages"]) == STAGES
    for row in summary["stages"].values():
        assert row["peak_rss"] > 0 and row["vmhwm"] >= row["peak_rss"] * 0.9
    # the weights' bytes by hand: embeddings and LM head 2 x 300 x 64, per layer q/o 2 x 64 x 64, k/v
    # 2 x 32 x 64, gated MLP 3 x 64 x 128, two norms 2 x 64; final norm 64; 4 bytes each; Qwen2 adds
    # q/k/v biases 64 + 32 + 32 per layer
    layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64 + (128 if family == "qwen2" else 0)
    n_params = 2 * 300 * 64 + 3 * layer + 64
    assert n_params * 4 < summary["weight_bytes"] < n_params * 4 + 4096  # + the safetensors header
    assert summary["generation_skipped_heads"] and summary["generated_tokens"] == 3
    assert summary["questions"] == 2 and summary["export_mode"] == "pruned"
    exported = AutoConfig.from_pretrained(summary["export_dir"], trust_remote_code=True)
    assert sum(exported.num_attention_heads_per_layer) == 12 - summary["export_heads"]
    _check_numerics(summary["numerics_full"])
    _check_numerics(summary["numerics_fp32"])
    _check_bfloat16(summary["numerics_fp32"])
    if family == "llama":
        _check_projection(tmp_path, summary, n_params)


def _check_projection(tmp_path, summary: dict, n_params: int) -> None:
    """benchmarks/project_gpu.py on the bench's output: the grid's passes counted by hand (the
    baseline and 13 scores + Random at the 6 quantiles above 0), MMLU's 57 subjects at two questions
    each (two share a 5-shot prefix), and the memory need from the hand-counted parameters in bfloat16."""
    (tmp_path / "bench.json").write_text(json.dumps(summary) + "\n")
    cmd = [sys.executable, str(SCRIPT.parent / "project_gpu.py"), "--bench", str(tmp_path / "bench.json"),
           "--tokenizer", "smollm2-135m", "--limit", "2", "--tflops", "100", "200"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    work, (projection,) = figures["work"], figures["projections"]
    assert work["questions"] == 2 * 57 and work["passes"] == 1 + 14 * 6
    assert 0 < work["padded_tokens_reuse"] < work["padded_tokens"]  # the 5-shot prefixes shared per subject
    assert projection["weight_gb"] == pytest.approx(2 * n_params / 1e9)
    peak = max(row["peak_ratio"] for name, row in summary["stages"].items() if name != "fp32")
    assert projection["need_gb"] == pytest.approx(2 * n_params / 1e9 * peak + 2.0)
    hours = projection["hours"]
    assert hours["100.0"]["grid"] == pytest.approx(2 * hours["200.0"]["grid"])
    assert hours["100.0"]["grid_reuse"] < hours["100.0"]["grid"]


def test_bench_fullsize_on_olmo2_zeroes_held_heads_and_exports_zeroed(tmp_path):
    config = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "num_hidden_layers": 2,
              "vocab_size": 300, "max_position_embeddings": 4096, "tie_word_embeddings": False}
    summary = _run(tmp_path, config, "--fp32-layers", "1")
    assert not summary["generation_skipped_heads"] and summary["export_mode"] == "zeroed"
    _check_numerics(summary["numerics_full"])
    _check_numerics(summary["numerics_fp32"])
    _check_bfloat16(summary["numerics_fp32"])
