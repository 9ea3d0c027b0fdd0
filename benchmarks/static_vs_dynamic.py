"""Static vs dynamic: "max % of heads zeroed within 1 point" with 95 % intervals, on held-out PIQA.

For each score (AHON (LN), AWFT) and nominal fraction p, on the same held-out questions:

- **dynamic**: the paper's intervention, τ_p calibrated on the calibration questions' scores;
- **static**: one set of ``round(p · layers · heads)`` heads, the most often flagged at τ_p on the
  calibration questions (``ih.static_heads``, rule ``flag_rate``).

Scores and thresholds come from PIQA questions ``--calibration`` (default 1000-1199); accuracy from
questions 0..``--n``-1, so nothing is chosen and scored on the same questions. The curve statistic
and its paired bootstrap interval are :func:`inactive_heads.analysis.curve_intervals` (the sweep
report's). Prints the table, then one JSON line; there each curve's max % within 1 point is
``{"value", "low", "high", "censored", ...}`` (:func:`inactive_heads.analysis.summary_records`):
``"censored": true`` when the curve never reached its line at the fractions tried, ``value`` then
being its lower bound (the largest realized %).

    python benchmarks/static_vs_dynamic.py --model smollm2-135m --n 200
"""

import argparse
import json
import time
import warnings

from inactive_heads.core.versions import library_versions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=200, help="held-out PIQA questions 0..n-1")
    parser.add_argument("--calibration", type=int, nargs=2, default=[1000, 1200], metavar=("FIRST", "END"))
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
    parser.add_argument("--scores", nargs="+", default=["ahon_ln", "awft"])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import torch

    import inactive_heads as ih
    from inactive_heads import analysis

    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    first, end = args.calibration
    if args.n > first:
        raise SystemExit(f"--n {args.n} overlaps the calibration questions from {first}")
    start = time.perf_counter()
    model = ih.load_model(args.model, dtype="float32", progress=False)
    plan = ih.plan_evaluation(model, "piqa", limit=end)
    cal = [i for i, t in enumerate(plan.targets) if first <= t[0][0] < end]
    held_out = plan.subset([i for i, t in enumerate(plan.targets) if t[0][0] < args.n])
    scores = ih.record_scores(model, [plan.inputs[i] for i in cal], args.scores, progress=False)
    baseline = ih.evaluate(model, held_out, progress=False)
    base = [100.0 * c for c in baseline.correct]
    print(f"baseline {baseline.accuracy_percent:.1f} % ({time.perf_counter() - start:.0f} s)", flush=True)
    curves, realized = {}, {}
    for key in args.scores:
        thresholds = ih.calibrate(scores, key, args.fractions)
        dyn, sta = [(0.0, base)], [(0.0, base)]
        for p, tau in thresholds:
            d = ih.evaluate(model, held_out, ablation=ih.DynamicAblation(key, tau), progress=False)
            dyn.append((100 * d.realized_fraction, [100.0 * c for c in d.correct]))
            heads = ih.static_heads(scores, key, p)
            s = ih.evaluate(model, held_out, ablation=ih.StaticAblation(heads), progress=False)
            sta.append((100 * s.realized_fraction, [100.0 * c for c in s.correct]))
            print(f"{key} p={p:g}: dynamic {d.accuracy_percent:.1f} % at {100 * d.realized_fraction:.1f} % zeroed; "
                  f"static {s.accuracy_percent:.1f} % at {100 * s.realized_fraction:.1f} % zeroed", flush=True)
        curves[f"{key} dynamic"], curves[f"{key} static"] = dyn, sta
        realized[f"{key} dynamic"] = [round(x, 2) for x, _ in dyn]
        realized[f"{key} static"] = [round(x, 2) for x, _ in sta]
    table = analysis.curve_intervals(curves, base, tolerance=1.0)
    print(f"baseline {baseline.accuracy_interval:.1f} % on n={baseline.n} held-out PIQA questions "
          f"(0-{args.n - 1}); calibration questions {first}-{end - 1}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(json.dumps({
        **library_versions(),
        "model": args.model,
        "task": "piqa",
        "n_held_out": baseline.n,
        "calibration_questions": [first, end - 1],
        "fractions": args.fractions,
        "baseline_accuracy": round(baseline.accuracy_percent, 2),
        "realized_pct": realized,
        "accuracy_pct": {k: [round(sum(v) / len(v), 2) for _, v in pts] for k, pts in curves.items()},
        "max_pct_within_1pt": {r["score"]: {k: round(v, 2) if isinstance(v, float) else v
                                            for k, v in r["max_pct_within"].items()}
                               for r in analysis.summary_records(table)},
        "seconds": round(time.perf_counter() - start, 1),
    }))


if __name__ == "__main__":
    main()
