"""MMLU evaluation speed against lm-eval's Hugging Face backend, side by side in one run.

Variants, all on the same questions, tokenized once, in the same length-sorted right-padded batches:

- ``hf``: what lm-eval's HF backend does — ``AutoModelForCausalLM`` with its default attention, full
  logits, ``log_softmax`` over the vocabulary, continuation log-probabilities summed;
- ``plain``: this toolkit's evaluator as it runs by default (``attention="auto"``: PyTorch's fused
  attention, since nothing reads the pattern; no prefix reuse), ``plain_exact`` (TransformerLens's
  arithmetic) and ``plain_reuse`` (each subject's few-shot prefix computed once);
- ``plain_bridge``: the same plain evaluation on the ``TransformerBridge`` of the same weights;
- ``dynamic_ahon_ln`` and ``dynamic_awft`` as they run by default (``auto``: exact arithmetic, so
  in-pass scores equal ``record_scores``'s to the bit), ``dynamic_ahon_ln_fast`` (fused attention:
  AHON reads no pattern), ``dynamic_ahon_ln_reuse`` / ``dynamic_awft_reuse`` (prefix reuse),
  and ``static``;
- ``sweep_none`` / ``sweep_reuse``: what ``run_sweep`` does for baseline + AHON (LN) and AWFT at
  3 thresholds each — one unablated pass that records both scores, then 6 dynamic runs — without
  and with prefix reuse. ``prefix_reuse_hit_rate`` = 1 − prefix layers computed / prefix layers a
  full recompute runs (inputs × layers), over the reused sweep's runs.

The machine may be shared: the variants run interleaved, round after round, so load falls on all
of them alike, and the fastest round of each counts. The last line printed is one JSON object.

    python benchmarks/bench_eval.py --model smollm2-135m --threads 2
"""

import argparse
import json
import sys
import time
import warnings

from inactive_heads.core.versions import library_versions


def hf_reference(hf_model, plan, batch_size):
    """lm-eval 0.4.5 HF-backend arithmetic on the plan's batches; (log-likelihoods, seconds)."""
    import torch

    from inactive_heads.runtime.hooks import make_batches

    lls = [[0.0] * len(req.choices) for req in plan.requests]
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in make_batches(plan.inputs, batch_size):
            logits = hf_model(input_ids=batch.tokens, attention_mask=batch.valid.long()).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, i in enumerate(batch.indices.tolist()):
                for r, c, first, cont in plan.targets[i]:
                    positions = torch.arange(first, first + len(cont))
                    lls[r][c] += float(logprobs[row, positions, torch.tensor(cont)].sum())
    return lls, time.perf_counter() - start


def max_abs_diff(a, b) -> float:
    return max(abs(x - y) for la, lb in zip(a, b) for x, y in zip(la, lb))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--subjects", nargs="+", default=["anatomy", "astronomy"])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ahon-ln", type=float, nargs=3, default=[0.3, 0.5, 0.7], help="AHON (LN) thresholds")
    parser.add_argument("--awft", type=float, nargs=3, default=[0.95, 0.9, 0.8], help="AWFT thresholds")
    parser.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                        help="run only these variants (default: all; 'hf' and 'plain' always run, the "
                             "anchors every ratio is taken against), e.g. --variants sweep_none sweep_reuse")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from transformers import AutoModelForCausalLM

    import inactive_heads as ih
    from inactive_heads.ablation.head_ablation import DynamicAblation, StaticAblation
    from inactive_heads.evaluation.evaluator import evaluate, plan_evaluation

    torch.set_num_threads(args.threads)
    model = ih.load_model(args.model, dtype="float32", progress=False)
    info = ih.model_info(model)
    hf_model = AutoModelForCausalLM.from_pretrained(info.source, dtype=torch.float32).eval()
    bridge = ih.load_model(args.model, backend="bridge", dtype="float32", progress=False)
    plan = plan_evaluation(model, "mmlu", subjects=args.subjects, limit=args.limit)
    static_heads = [(l, h) for l in range(info.n_layers) for h in range(0, info.n_heads, 4)]
    sweep = [None] + [DynamicAblation("ahon_ln", t).spec for t in args.ahon_ln] + [
        DynamicAblation("awft", t).spec for t in args.awft]

    def run(ablation=None, reuse=False, attention="auto", record=None):
        return evaluate(model, plan, ablation=ablation, batch_size=args.batch_size, progress=False,
                        reuse_prefix=reuse, attention=attention, record=record)

    def run_sweep(reuse):
        start = time.perf_counter()
        results = [run(None, reuse, record=["ahon_ln", "awft"])] + [run(spec, reuse) for spec in sweep[1:]]
        return results, time.perf_counter() - start

    variants = {
        "hf": lambda: hf_reference(hf_model, plan, args.batch_size),
        "plain": lambda: run(),
        "plain_exact": lambda: run(attention="exact"),
        "plain_reuse": lambda: run(reuse=True),
        "plain_bridge": lambda: evaluate(bridge, plan, batch_size=args.batch_size, progress=False),
        "dynamic_ahon_ln": lambda: run(DynamicAblation("ahon_ln", args.ahon_ln[1])),
        "dynamic_ahon_ln_fast": lambda: run(DynamicAblation("ahon_ln", args.ahon_ln[1]), attention="fast"),
        "dynamic_ahon_ln_reuse": lambda: run(DynamicAblation("ahon_ln", args.ahon_ln[1]), reuse=True),
        "dynamic_awft": lambda: run(DynamicAblation("awft", args.awft[1])),
        "dynamic_awft_fast": lambda: run(DynamicAblation("awft", args.awft[1]), attention="fast"),
        "dynamic_awft_reuse": lambda: run(DynamicAblation("awft", args.awft[1]), reuse=True),
        "static": lambda: run(StaticAblation(static_heads)),
        "sweep_none": lambda: run_sweep(False),
        "sweep_reuse": lambda: run_sweep(True),
    }
    if args.variants:
        unknown = sorted(set(args.variants) - set(variants))
        if unknown:
            parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(variants)}")
        variants = {k: v for k, v in variants.items() if k in {"hf", "plain", *args.variants}}
    best: dict[str, float] = {}
    out: dict[str, object] = {}
    for round_ in range(args.rounds):
        for name, make in variants.items():
            value = make()
            seconds = value[1] if isinstance(value, tuple) else value.seconds
            print(f"round {round_ + 1} {name:16s} {seconds:8.2f} s", file=sys.stderr, flush=True)
            if name not in best or seconds < best[name]:
                best[name] = seconds
            out[name] = value[0] if isinstance(value, tuple) else value

    n = plain_n = out["plain"].n
    qps = {name: n / s for name, s in best.items() if not name.startswith("sweep")}
    hf_lls = out["hf"]
    print(f"\n{args.model}: MMLU {', '.join(args.subjects)} (limit {args.limit}/subject), n={plain_n}, "
          f"batch size {args.batch_size}, {args.threads} threads, best of {args.rounds} interleaved rounds")
    print(f"{'variant':16s} {'seconds':>8s} {'q/s':>7s} {'x hf q/s':>9s}")
    for name, s in best.items():
        ratio = f"{qps[name] / qps['hf']:9.2f}" if name in qps else f"{'':9s}"
        print(f"{name:16s} {s:8.2f} {n / s if name in qps else float('nan'):7.2f} {ratio}")
    ratios = {f"ratio_qps_{RATIO_NAMES.get(name, name)}_vs_hf": round(q / qps["hf"], 3)
              for name, q in qps.items() if name != "hf"}
    summary = {
        **library_versions(),
        "model": args.model,
        "model_class": type(model).__name__,
        "subjects": args.subjects,
        "limit_per_subject": args.limit,
        "n_questions": plain_n,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "rounds": args.rounds,
        "questions_per_s": {k: round(v, 3) for k, v in qps.items()},
        **ratios,
        "plain_answers_equal_hf": out["plain"].correct == [
            max(range(len(ll)), key=ll.__getitem__) == req.gold for ll, req in zip(hf_lls, plan.requests)],
        "plain_max_abs_dll_vs_hf": max_abs_diff(out["plain"].loglikelihoods, hf_lls),
    }
    if "sweep_none" in out and "sweep_reuse" in out:
        summary.update(sweep_summary(out["sweep_none"], out["sweep_reuse"], best))
    print(json.dumps(summary))


# The JSON names of the ratios (kept from before variants could be chosen).
RATIO_NAMES = {"dynamic_ahon_ln": "dynamic", "dynamic_ahon_ln_fast": "dynamic_fast",
               "dynamic_ahon_ln_reuse": "dynamic_reuse"}


def sweep_summary(sweep_none, sweep_reuse, best) -> dict:
    """The sweep's speed-up from prefix reuse, what the cache held, and how far the records moved."""
    identical = all(a.correct == b.correct and a.realized_fraction_per_layer == b.realized_fraction_per_layer
                    for a, b in zip(sweep_none, sweep_reuse))
    computed = sum(r.prefix_reuse.get("prefix_layers_computed", 0) for r in sweep_reuse)
    needed = sum(r.prefix_reuse.get("prefix_layers_needed", 0) for r in sweep_reuse)
    return {
        # speed-up of the sweep from prefix reuse: wall without / wall with
        "ratio_wall_sweep_reuse_vs_none": round(best["sweep_none"] / best["sweep_reuse"], 3),
        "wall_sweep_s": {"none": round(best["sweep_none"], 2), "reuse": round(best["sweep_reuse"], 2)},
        "prefix_reuse_hit_rate": round(1 - computed / needed, 3) if needed else None,
        "prefix_reuse_hit_rate_per_run": [r.prefix_reuse.get("hit_rate") for r in sweep_reuse],
        "seconds_per_run": {"none": [round(r.seconds, 2) for r in sweep_none],
                            "reuse": [round(r.seconds, 2) for r in sweep_reuse]},
        "prefix_reuse_branches": sum(r.prefix_reuse.get("branches", 0) for r in sweep_reuse),
        "sweep_records_identical": identical,
        "sweep_max_abs_dll_reuse_vs_none": max(max_abs_diff(a.loglikelihoods, b.loglikelihoods)
                                               for a, b in zip(sweep_none, sweep_reuse)),
    }


if __name__ == "__main__":
    main()
