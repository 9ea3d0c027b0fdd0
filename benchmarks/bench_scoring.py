"""Cost of recording all scores, against a plain forward of the same batches, in one run.

Each variant runs in its own fresh process (so peak RSS is its own), on the same real inputs
(MMLU 5-shot prompts built the way the evaluator builds them), several rounds interleaved; the
fastest round of each counts. Variants:

- forward:  the model's ordinary forward (logits) on the batches
- record:   ``record_scores`` with every registered score (hooks reduce in place, no logits)
- cache:    TransformerLens ``run_with_cache`` of hook_pattern / hook_v / hook_z

The last line printed is one JSON object with the ratios.

    python benchmarks/bench_scoring.py --model smollm2-135m
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("forward", "record", "cache")


def worker(args) -> dict:
    import torch

    import inactive_heads as ih
    from inactive_heads.evaluate import plan_evaluation
    from inactive_heads.hooks import make_batches

    model = ih.load_model(args.model, progress=False)
    plan = plan_evaluation(model, "mmlu", subjects=args.subjects, limit=args.limit)
    sequences = plan.inputs[: args.n]
    batches = list(make_batches(sequences, args.batch_size))
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

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

    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n_tokens = sum(len(s) for s in sequences)
    return {
        "variant": args.variant,
        "seconds": seconds,
        "peak_rss_mb": peak / 1024,
        "activation_peak_mb": (peak - rss_loaded) / 1024,
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
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(worker(args)))
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
            print(f"round {round_ + 1} {variant:8s} {res['seconds']:7.2f} s  peak RSS {res['peak_rss_mb']:7.0f} MB",
                  file=sys.stderr)
            if variant not in best or res["seconds"] < best[variant]["seconds"]:
                best[variant] = {**res, "peak_rss_mb": min(res["peak_rss_mb"], best.get(variant, res)["peak_rss_mb"]),
                                 "activation_peak_mb": min(res["activation_peak_mb"],
                                                           best.get(variant, res)["activation_peak_mb"])}
    f = best["forward"]
    print(f"\n{args.model}: {f['n_sequences']} MMLU prompts, {f['n_tokens']} tokens, batch size {args.batch_size}, "
          f"best of {args.rounds} rounds")
    print(f"{'variant':10s} {'seconds':>9s} {'x forward':>10s} {'peak RSS MB':>12s} {'x forward':>10s} {'act. MB':>9s}")
    for v in VARIANTS:
        b = best[v]
        print(f"{v:10s} {b['seconds']:9.2f} {b['seconds'] / f['seconds']:10.2f} {b['peak_rss_mb']:12.0f} "
              f"{b['peak_rss_mb'] / f['peak_rss_mb']:10.2f} {b['activation_peak_mb']:9.0f}")
    summary = {
        "model": args.model,
        "n_sequences": f["n_sequences"],
        "n_tokens": f["n_tokens"],
        "batch_size": args.batch_size,
        "ratio_wall_record_vs_forward": round(best["record"]["seconds"] / f["seconds"], 3),
        "ratio_peakmem_record_vs_forward": round(best["record"]["peak_rss_mb"] / f["peak_rss_mb"], 3),
        "ratio_activation_mem_record_vs_forward": round(
            best["record"]["activation_peak_mb"] / max(f["activation_peak_mb"], 1e-9), 3),
        "ratio_wall_cache_vs_forward": round(best["cache"]["seconds"] / f["seconds"], 3),
        "ratio_peakmem_cache_vs_forward": round(best["cache"]["peak_rss_mb"] / f["peak_rss_mb"], 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
