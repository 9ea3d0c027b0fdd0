"""Cost of recording all scores, against a plain forward of the same batches, in one run.

Each variant runs in its own fresh process (so peak RSS is its own), on the same real inputs
(MMLU 5-shot prompts built the way the evaluator builds them), several rounds interleaved; the
fastest round of each counts. Variants:

- forward:  the model's ordinary forward (logits) on the batches
- record:   ``record_scores`` with every registered score (hooks reduce in place, no logits)
- cache:    TransformerLens ``run_with_cache`` of hook_pattern / hook_v / hook_z

Long-input case (``--long-model``, default Qwen2.5-Coder-0.5B; ``--long-tokens``, default 4096
tokens of LAMBADA text, batch size 1), each variant again in a fresh process, at the full length
T and at T/2:

- forward:  the ordinary forward with logits (what the ratio's denominator is)
- body:     the forward without the unembedding (no logits; on a ``TransformerBridge``, its
            Hugging Face base model, through which the bridge's modules run)
- record:   ``record_scores`` with every registered score

Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA, else peak RSS; "activation" memory is
the peak minus the memory right after loading. On CUDA every timing waits for the GPU's queued work
before the clock is read (both cases). ``ratio_peakmem_record_vs_forward_long`` is the
record peak over the forward peak at T (goal: <= 1.15).

Projection to 8B and 14B models in bf16 (batch 1, T tokens). While scores are recorded only one
layer's attention tensors are alive at a time, so the activation peak of one layer is, per token
and per layer, a quadratic part (attention scores and pattern: per head, per key) and a linear part
(residual, MLP, values, outputs, float32 score copies: per model dimension)::

    A(T) = a * n_heads * T**2 + b * d_model * T          (bytes, measured in the model's dtype)

The two lengths give ``a`` and ``b`` exactly for each variant (two equations, two unknowns). For a
target model with H heads, width D, N parameters and dtype size s (2 for bf16)::

    peak(T) = N * s + (a * H * T**2 + b * D * T) * s / s_measured

(activations scale with the element size, except the float32 copies made for the scores, about
4 bytes per d_model and token, which adds under 0.1 GB at these sizes). Targets: Llama-3.1-8B (32 heads, d_model 4096, 8.03e9 parameters) and
Qwen2.5-14B (40 heads, d_model 5120, 14.77e9 parameters).

On a slow CPU, ``--long-layers N`` runs only the first N layers of the long case: while scores are
recorded only one layer's tensors are alive at a time, so the activation peak does not depend on
depth; the reported peaks are then the whole model's loaded memory (measured before the layers are
dropped) plus the measured activation peak (``long_layers_run`` says how many layers ran).

The last line printed is one JSON object with the ratios and projections.

    python benchmarks/bench_scoring.py --model smollm2-135m
    python benchmarks/bench_scoring.py --skip-long      # the short case only
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clock import synchronizer  # noqa: E402  (the benchmarks' one device-aware clock)

from inactive_heads.core.versions import library_versions

VARIANTS = ("forward", "record", "cache")
LONG_VARIANTS = ("forward", "body", "record")
TARGETS = {  # name: (heads, d_model, parameters)
    "llama-3.1-8b": (32, 4096, 8.03e9),
    "qwen2.5-14b": (40, 5120, 14.77e9),
}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak(device) -> float:
    """Start a fresh peak measurement; returns the memory in use now (MB)."""
    import gc

    import torch

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    try:  # Linux: give freed heap back, then reset the process's peak RSS (VmHWM)
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_mb("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_mb(device) -> float:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        return _status_mb("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def long_worker(args) -> dict:
    """One long-input variant in this (fresh) process."""
    import torch

    import inactive_heads as ih
    from inactive_heads.evaluation.texts import _all_passages
    from inactive_heads.models.tl_line import is_hooked_transformer
    from inactive_heads.runtime.hooks import model_device

    model = ih.load_model(args.model, dtype="float32", progress=False)
    device = model_device(model)
    loaded_full = _reset_peak(device)
    info = ih.model_info(model)
    hooked = is_hooked_transformer(model)
    if args.layers and args.layers < info.n_layers and not hooked:
        raise SystemExit("--long-layers truncates a HookedTransformer's blocks; a TransformerBridge runs its "
                         "Hugging Face model whole: run the long case with --long-layers 0")
    if args.layers and args.layers < info.n_layers:
        # Only one layer's activations are alive at a time, so the activation peak does not depend
        # on depth: keeping the first layers measures it at a fraction of the compute.
        import dataclasses

        model.blocks = model.blocks[: args.layers]
        model.cfg.n_layers = args.layers
        model.inactive_heads_info = dataclasses.replace(info, n_layers=args.layers)
    ids = model.tokenizer("\n\n".join(_all_passages()[:400]), add_special_tokens=False)["input_ids"]
    if len(ids) < args.tokens:
        raise SystemExit(f"only {len(ids)} tokens of text; lower --long-tokens")
    tokens = torch.tensor([ids[: args.tokens]], device=device)
    mask = torch.ones_like(tokens)
    loaded = _reset_peak(device)
    sync = synchronizer(device)
    start = time.perf_counter()
    with torch.inference_mode():
        if args.variant == "forward":
            model(tokens, attention_mask=mask)
        elif args.variant == "body" and hooked:
            model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layers)
        elif args.variant == "body":  # a bridge: its Hugging Face base model (its hooks fire), no head
            model.original_model.base_model(input_ids=tokens, attention_mask=mask, use_cache=False)
        else:
            ih.record_scores(model, [ids[: args.tokens]], batch_size=1, progress=False)
    sync()
    seconds = time.perf_counter() - start
    peak = _peak_mb(device)
    return {"variant": args.variant, "tokens": args.tokens, "seconds": seconds,
            "layers_run": model.cfg.n_layers, "n_layers": info.n_layers,
            "loaded_mb": loaded, "loaded_full_mb": loaded_full, "peak_mb": peak,
            # the peak of the whole model: its loaded memory plus the (depth-independent) activations
            "peak_full_mb": loaded_full + (peak - loaded),
            "activation_mb": peak - loaded, "n_heads": info.n_heads, "d_model": info.d_model,
            "dtype_bytes": torch.tensor([], dtype=next(model.parameters()).dtype).element_size()}


def _fit(t1: int, a1: float, t2: int, a2: float, heads: int, width: int) -> tuple[float, float]:
    """Solve A(T) = a*H*T^2 + b*D*T from two (T, A) points; returns (a, b) in bytes."""
    # [H t1^2, D t1; H t2^2, D t2] [a; b] = [a1; a2]
    m11, m12, m21, m22 = heads * t1 * t1, width * t1, heads * t2 * t2, width * t2
    det = m11 * m22 - m12 * m21
    return (a1 * m22 - m12 * a2) / det, (m11 * a2 - m21 * a1) / det


def run_long(args) -> dict:
    results: dict[tuple[str, int], dict] = {}
    lengths = (args.long_tokens // 2, args.long_tokens)
    for tokens in lengths:
        for variant in LONG_VARIANTS:
            cmd = [sys.executable, __file__, "--long-variant", variant, "--model", args.long_model,
                   "--tokens", str(tokens), "--layers", str(args.long_layers)]
            # Large blocks from mmap, so that freed memory leaves the process and RSS measures use.
            env = {**os.environ, "PYTHONWARNINGS": "ignore", "MALLOC_MMAP_THRESHOLD_": "131072"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.exit(f"long {variant} worker failed:\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[(variant, tokens)] = res
            print(f"long {tokens:5d} tokens {variant:8s} {res['seconds']:8.2f} s  peak {res['peak_full_mb']:8.0f} MB  "
                  f"activations {res['activation_mb']:8.0f} MB  ({res['layers_run']} of {res['n_layers']} layers run)",
                  file=sys.stderr)
    t1, t2 = lengths
    full = {v: results[(v, t2)] for v in LONG_VARIANTS}
    heads, width, size = full["record"]["n_heads"], full["record"]["d_model"], full["record"]["dtype_bytes"]
    summary = {
        "long_model": args.long_model,
        "long_tokens": t2,
        "long_layers_run": full["record"]["layers_run"],
        "long_n_layers": full["record"]["n_layers"],
        "long_peak_mb": {v: round(full[v]["peak_full_mb"]) for v in LONG_VARIANTS},
        "long_activation_mb": {v: round(full[v]["activation_mb"]) for v in LONG_VARIANTS},
        "ratio_peakmem_record_vs_forward_long": round(full["record"]["peak_full_mb"] / full["forward"]["peak_full_mb"], 3),
        "ratio_peakmem_record_vs_body_long": round(full["record"]["peak_full_mb"] / full["body"]["peak_full_mb"], 3),
        "ratio_activation_mem_record_vs_forward_long": round(
            full["record"]["activation_mb"] / max(full["forward"]["activation_mb"], 1e-9), 3),
        "ratio_wall_record_vs_forward_long": round(full["record"]["seconds"] / full["forward"]["seconds"], 3),
    }
    projection = {}
    for variant in ("record", "body"):
        a, b = _fit(t1, results[(variant, t1)]["activation_mb"] * 2**20, t2,
                    results[(variant, t2)]["activation_mb"] * 2**20, heads, width)
        summary[f"fit_{variant}_bytes"] = {"per_head_token2": round(a, 4), "per_dmodel_token": round(b, 3)}
        for name, (h, d, n) in TARGETS.items():
            act = (a * h * t2 * t2 + b * d * t2) * 2 / size
            projection.setdefault(name, {})[f"{variant}_peak_gb_bf16"] = round((n * 2 + act) / 2**30, 2)
            projection[name][f"{variant}_activation_gb_bf16"] = round(act / 2**30, 2)
    summary["projected_bf16_T"] = t2
    summary["projected"] = projection
    return summary


def worker(args) -> dict:
    import torch

    import inactive_heads as ih
    from inactive_heads.evaluation.evaluator import plan_evaluation
    from inactive_heads.runtime.hooks import make_batches, model_device

    model = ih.load_model(args.model, dtype="float32", progress=False)
    device = model_device(model)
    on_cuda = device.type == "cuda"
    plan = plan_evaluation(model, "mmlu", subjects=args.subjects, limit=args.limit)
    sequences = plan.inputs[: args.n]
    batches = list(make_batches(sequences, args.batch_size, device=device))
    loaded = _reset_peak(device) if on_cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sync = synchronizer(device)

    def run():
        if args.variant == "forward":
            with torch.inference_mode():
                for b in batches:
                    model(b.tokens, attention_mask=b.valid.long())
        elif args.variant == "record":
            ih.record_scores(model, sequences, batch_size=args.batch_size, progress=False)
        else:
            names = {f"blocks.{l}.attn.hook_{n}" for l in range(model.cfg.n_layers) for n in ("pattern", "v", "z")}
            with torch.inference_mode():
                for b in batches:
                    model.run_with_cache(b.tokens, attention_mask=b.valid.long(), names_filter=lambda n: n in names)

    sync()
    start = time.perf_counter()
    run()
    sync()
    seconds = time.perf_counter() - start
    peak = _peak_mb(device) if on_cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n_tokens = sum(len(s) for s in sequences)
    return {
        "variant": args.variant,
        "seconds": seconds,
        "peak_mb": peak,
        "activation_peak_mb": peak - loaded,
        "n_sequences": len(sequences),
        "n_tokens": n_tokens,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=16, help="number of sequences (MMLU prompts)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subjects", nargs="+", default=["anatomy", "astronomy"])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--long-model", default="qwen2.5-coder-0.5b", help="model of the long-input case")
    parser.add_argument("--long-tokens", type=int, default=4096, help="tokens of the long input (also run at half)")
    parser.add_argument("--long-layers", type=int, default=0,
                        help="run only the first N layers in the long case (0: all); the activation peak does "
                        "not depend on depth, and the reported peaks add the whole model's loaded memory")
    parser.add_argument("--skip-long", action="store_true", help="skip the long-input case")
    parser.add_argument("--skip-short", action="store_true", help="skip the short (MMLU) case")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--long-variant", choices=LONG_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(worker(args)))
        return
    if args.long_variant:
        args.variant = args.long_variant
        print(json.dumps(long_worker(args)))
        return
    if args.skip_short:
        print(json.dumps({**library_versions(), **run_long(args)}))
        return

    best: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model, "--n", str(args.n),
                   "--batch-size", str(args.batch_size), "--limit", str(args.limit), "--subjects", *args.subjects]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if out.returncode != 0:
                sys.exit(f"{variant} worker failed:\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"round {round_ + 1} {variant:8s} {res['seconds']:7.2f} s  peak {res['peak_mb']:7.0f} MB",
                  file=sys.stderr)
            if variant not in best or res["seconds"] < best[variant]["seconds"]:
                best[variant] = {**res, "peak_mb": min(res["peak_mb"], best.get(variant, res)["peak_mb"]),
                                 "activation_peak_mb": min(res["activation_peak_mb"],
                                                           best.get(variant, res)["activation_peak_mb"])}
    f = best["forward"]
    print(f"\n{args.model}: {f['n_sequences']} MMLU prompts, {f['n_tokens']} tokens, batch size {args.batch_size}, "
          f"best of {args.rounds} rounds")
    print(f"{'variant':10s} {'seconds':>9s} {'x forward':>10s} {'peak MB':>12s} {'x forward':>10s} {'act. MB':>9s}")
    for v in VARIANTS:
        b = best[v]
        print(f"{v:10s} {b['seconds']:9.2f} {b['seconds'] / f['seconds']:10.2f} {b['peak_mb']:12.0f} "
              f"{b['peak_mb'] / f['peak_mb']:10.2f} {b['activation_peak_mb']:9.0f}")
    summary = {
        "model": args.model,
        "n_sequences": f["n_sequences"],
        "n_tokens": f["n_tokens"],
        "batch_size": args.batch_size,
        "ratio_wall_record_vs_forward": round(best["record"]["seconds"] / f["seconds"], 3),
        "ratio_peakmem_record_vs_forward": round(best["record"]["peak_mb"] / f["peak_mb"], 3),
        "ratio_activation_mem_record_vs_forward": round(
            best["record"]["activation_peak_mb"] / max(f["activation_peak_mb"], 1e-9), 3),
        "ratio_wall_cache_vs_forward": round(best["cache"]["seconds"] / f["seconds"], 3),
        "ratio_peakmem_cache_vs_forward": round(best["cache"]["peak_mb"] / f["peak_mb"], 3),
    }
    if not args.skip_long:
        summary.update(run_long(args))
    print(json.dumps({**library_versions(), **summary}))


if __name__ == "__main__":
    main()
