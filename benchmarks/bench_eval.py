"""MMLU evaluation speed: plain, dynamic AHON (LN) ablation and static ablation, in one run.

The model is loaded once and the questions tokenized once; the three variants run interleaved for
several rounds and the fastest round of each counts (this machine is shared and noisy). The last
line printed is one JSON object with the ratios.

    python benchmarks/bench_eval.py --model smollm2-135m
"""

import argparse
import json
import sys
import warnings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--subjects", nargs="+", default=["anatomy", "astronomy"])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=0.5, help="AHON (LN) threshold for the dynamic run")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import inactive_heads as ih
    from inactive_heads.ablation import DynamicAblation, StaticAblation
    from inactive_heads.evaluate import evaluate, plan_evaluation

    model = ih.load_model(args.model, progress=False)
    info = ih.model_info(model)
    plan = plan_evaluation(model, "mmlu", subjects=args.subjects, limit=args.limit)
    static_heads = [(l, h) for l in range(info.n_layers) for h in range(0, info.n_heads, 4)]
    variants = {
        "plain": lambda: None,
        "dynamic": lambda: DynamicAblation("ahon_ln", args.threshold),
        "static": lambda: StaticAblation(static_heads),
    }
    best: dict[str, object] = {}
    for round_ in range(args.rounds):
        for name, make in variants.items():
            res = evaluate(model, plan, ablation=make(), batch_size=args.batch_size, progress=False)
            print(f"round {round_ + 1} {name:8s} {res.seconds:7.2f} s  {res.questions_per_s:6.2f} q/s  "
                  f"acc {res.accuracy_percent:5.1f}%  zeroed {100 * res.realized_fraction:5.2f}%", file=sys.stderr)
            if name not in best or res.seconds < best[name].seconds:
                best[name] = res
    plain = best["plain"]
    print(f"\n{args.model}: MMLU {', '.join(args.subjects)} (limit {args.limit}/subject), n={plain.n}, "
          f"batch size {args.batch_size}, best of {args.rounds}")
    print(f"{'variant':9s} {'seconds':>8s} {'q/s':>7s} {'x plain':>8s} {'acc %':>6s} {'zeroed %':>9s}")
    for name, res in best.items():
        print(f"{name:9s} {res.seconds:8.2f} {res.questions_per_s:7.2f} {res.seconds / plain.seconds:8.2f} "
              f"{res.accuracy_percent:6.1f} {100 * res.realized_fraction:9.2f}")
    print(json.dumps({
        "model": args.model,
        "n_questions": plain.n,
        "batch_size": args.batch_size,
        "questions_per_s_plain": round(plain.questions_per_s, 3),
        "questions_per_s_dynamic": round(best["dynamic"].questions_per_s, 3),
        "questions_per_s_static": round(best["static"].questions_per_s, 3),
        "ratio_wall_dynamic_vs_plain": round(best["dynamic"].seconds / plain.seconds, 3),
        "ratio_wall_static_vs_plain": round(best["static"].seconds / plain.seconds, 3),
        "realized_percent_dynamic": round(100 * best["dynamic"].realized_fraction, 2),
    }))


if __name__ == "__main__":
    main()
