"""Project the paper's MMLU grid onto one GPU from measured figures: memory per GPU size and hours.

No GPU is needed: the projection combines

- the **peak memory ratio** (peak resident bytes / weight bytes, the largest over the pipeline's
  stages load to export) that ``benchmarks/bench_fullsize.py`` measured for a shape (its last JSON
  line, ``--bench``), applied to the full model's weight bytes (the shape's parameters x 2 bytes in
  bfloat16), plus ``--overhead-gb`` for the CUDA context and the allocator's slack;
- the **work of the grid**: the sweep's passes (``SweepConfig(scores=PAPER_SCORES)``: the baseline,
  which records the 13 scores, and every ablated run; the p = 0 runs reuse the baseline) over all of
  MMLU, 5-shot, as the toolkit plans it: the input lengths come from a real tokenizer
  (``--tokenizer``, a built-in model; Qwen2.5's tokenizer is Qwen2.5-14B's, and tokenizes English
  within a few percent of Llama-3's and OLMo-2's), batched as the evaluator batches them
  (``sweep.estimate.plan_work``, padding counted), with and without prefix reuse (with it, each
  subject's few-shot prefix once per pass, plus the share ``1 - --hit-rate`` of its rows that a
  dynamic run recomputes where its decisions differ);
- the **FLOPs per token** of the shape (the accountant's ``flops_per_token``, at the mean input's
  average attended length), divided by an assumed sustained bfloat16 throughput (``--tflops``;
  measure yours with ``benchmarks/gpu_check.py --paper-row``).

    python benchmarks/project_gpu.py --bench llama8b.json --bench olmo7b.json --tflops 200 400

It prints one markdown table per shape and a JSON line with every figure.
"""

import argparse
import json
import sys
from pathlib import Path

GPUS_GB = (24, 40, 48, 80, 141)  # RTX 4090/A10-class, A100-40, L40S/A6000, A100/H100-80, H200


def grid_work(tokenizer_model: str, batch_size: int, limit: int | None) -> dict:
    """Tokens and passes of the paper's grid on MMLU (5-shot, plain prompt) as the toolkit plans it."""
    import inactive_heads as ih
    from inactive_heads.evaluation.evaluator import plan_evaluation
    from inactive_heads.scoring.scores import PAPER_SCORES
    from inactive_heads.sweep.config import SweepConfig
    from inactive_heads.sweep.estimate import plan_work

    model = ih.load_model(tokenizer_model, progress=False)
    plan = plan_evaluation(model, "mmlu", num_fewshot=5, apply_chat_template=False, limit=limit)
    config = SweepConfig(model=tokenizer_model, scores=list(PAPER_SCORES), limit=limit)
    ablated = [rid for rid, key, q in config.run_ids() if key is not None and not config.reuses_baseline(key, q)]
    full, reused = plan_work(plan, batch_size, reuse=False), plan_work(plan, batch_size, reuse=True)
    return {"tokenizer": tokenizer_model, "questions": len(plan.inputs), "inputs": full.inputs,
            "passes": 1 + len(ablated), "batch_size": batch_size,
            "tokens": full.tokens, "padded_tokens": full.padded_tokens,
            "padded_tokens_reuse": reused.padded_tokens, "mean_length": full.tokens / max(full.inputs, 1)}


def project(bench: dict, work: dict, tflops: list[float], overhead_gb: float, hit_rate: float) -> dict:
    from inactive_heads.pruning.accountant import model_shape

    shape = model_shape(bench["shape"])
    weight_bytes = 2 * shape.n_params()  # bfloat16, the whole model (a bench may have cut layers)
    stages = {k: v for k, v in bench["stages"].items() if k != "fp32"}  # fp32: the model freed, a check only
    ratio = max(v["peak_ratio"] for v in stages.values())
    need_gb = weight_bytes * ratio / 1e9 + overhead_gb
    per_token = shape.flops_per_token(work["mean_length"] / 2)
    # with reuse, the prefix rows a dynamic run recomputes where its decisions differ: (1 - hit rate) of them
    reuse_tokens = work["padded_tokens_reuse"] + (1 - hit_rate) * (work["padded_tokens"] - work["padded_tokens_reuse"])
    out = {"shape": bench["shape"], "weight_gb": weight_bytes / 1e9, "peak_ratio": ratio,
           "measured_layers": bench.get("n_layers"), "need_gb": need_gb,
           "fits": {gb: need_gb <= gb for gb in GPUS_GB}, "flops_per_token": per_token, "hours": {}}
    for rate in tflops:
        seconds_per_pass = work["padded_tokens"] * per_token / (rate * 1e12)
        out["hours"][rate] = {
            "seconds_per_question": seconds_per_pass / work["questions"],
            "grid": work["passes"] * seconds_per_pass / 3600,
            "grid_reuse": work["passes"] * reuse_tokens * per_token / (rate * 1e12) / 3600,
        }
    return out


def markdown(p: dict, work: dict) -> str:
    fits = ", ".join(f"{gb} GB {'yes' if ok else 'no'}" for gb, ok in p["fits"].items())
    lines = [f"**{p['shape']}**: {p['weight_gb']:.1f} GB of bfloat16 weights; measured peak {p['peak_ratio']:.3f}x "
             f"the weights ({p['measured_layers']} layers measured) -> about {p['need_gb']:.1f} GB on a GPU "
             f"({fits}).", "",
             "| sustained TFLOP/s | s per question | grid hours | grid hours, prefix reuse |", "|---|---|---|---|"]
    for rate, h in p["hours"].items():
        lines.append(f"| {rate:g} | {h['seconds_per_question']:.4f} | {h['grid']:.1f} | {h['grid_reuse']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="append", required=True, metavar="JSON",
                        help="a file holding bench_fullsize.py's output (its last line is read); repeatable")
    parser.add_argument("--also", action="append", default=[], metavar="SHAPE",
                        help="also project this paper shape, assuming the first bench's peak ratio; repeatable")
    parser.add_argument("--tokenizer", default="qwen2.5-coder-0.5b", help="built-in model whose tokenizer plans MMLU")
    parser.add_argument("--tflops", type=float, nargs="+", default=[200.0, 400.0],
                        help="assumed sustained bfloat16 TFLOP/s (H100 SXM's dense peak is 989)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="questions per MMLU subject (default all)")
    parser.add_argument("--hit-rate", type=float, default=0.96,
                        help="share of the prefix rows beyond each prefix's one computation a pass serves from "
                             "the cache (bench_eval.py's sweep at 100 questions a subject: 0.955 overall, "
                             "0.965 less that one computation)")
    parser.add_argument("--overhead-gb", type=float, default=2.0, help="CUDA context and allocator slack")
    args = parser.parse_args(argv)
    benches = [json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in args.bench]
    work = grid_work(args.tokenizer, args.batch_size, args.limit)
    print(f"MMLU, 5-shot, plain prompt, {work['questions']} questions, mean {work['mean_length']:.0f} tokens "
          f"({work['tokenizer']}'s tokenizer), batches of {work['batch_size']}: {work['passes']} passes "
          f"(baseline + ablated runs); padded tokens per pass {work['padded_tokens']:,} "
          f"({work['padded_tokens_reuse']:,} with prefix reuse)\n")
    for name in args.also:  # another shape, at the first bench's measured ratios
        benches.append({**benches[0], "shape": name, "n_layers": f"none; ratio of {benches[0]['shape']}"})
    projections = [project(b, work, args.tflops, args.overhead_gb, args.hit_rate) for b in benches]
    for p in projections:
        print(markdown(p, work) + "\n")
    print(json.dumps({"work": work, "projections": projections}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
