"""``inactive-heads demo``: the paper's experiment in miniature on SmolLM2 and real PIQA."""

import argparse

from .options import add_device_arguments, positive_int, quantile
from .registry import register_subcommand

# The demo is sized to finish in minutes on 2 CPU cores (220 s measured, docs/sweeps.md) and still say something: PIQA
# 0-shot (two short continuations per question, SmolLM2-135M well above the 50 % chance level),
# many questions, few thresholds, two scores and Random. The label-free answer agreement is paired
# and separates the scores even where accuracy differences are within the sampling error.
DEMO_TASK = "piqa"
DEMO_LIMIT = 100
DEMO_DTYPE = "float32"
DEMO_SCORES = ("ahon_ln", "awft")
DEMO_QUANTILES = (0.0, 0.1, 0.3)
# Few-shot examples per demo task: none, except WinoGrande, whose chat prompt (lm-eval renders only
# the examples before the filled-in sentence) would otherwise be an empty conversation.
DEMO_FEWSHOT = {"piqa": 0, "mmlu": 0, "winogrande": 1}


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_results", help="results folder (default demo_results; resumable)")
    parser.add_argument("--task", default=DEMO_TASK, choices=tuple(DEMO_FEWSHOT),
                        help=f"benchmark (default {DEMO_TASK}; 0-shot, WinoGrande 1-shot: its chat prompt needs "
                        "one example before the sentence)")
    parser.add_argument("--subjects", nargs="+", metavar="SUBJECT", help="MMLU subjects (with --task mmlu)")
    parser.add_argument("--limit", type=positive_int, default=DEMO_LIMIT,
                        help=f"questions (of each MMLU subject) (default {DEMO_LIMIT})")
    parser.add_argument("--quantiles", nargs="+", type=quantile, default=list(DEMO_QUANTILES),
                        help=f"p values (default {' '.join(f'{q:g}' for q in DEMO_QUANTILES)})")
    add_device_arguments(parser, dtypes=("float32", "bfloat16", "auto"), default_dtype=DEMO_DTYPE)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # tests: a tiny model


def _demo_reading(results) -> str:
    """One honest sentence on what the demo's numbers show, read from their 95 % intervals: the
    runs at the largest p (comparable % of heads zeroed), their answer agreement with the
    unablated model and their paired accuracy change."""
    from ..analysis.tables import BASELINE, runs_table

    table = runs_table(results)
    table = table[table["score"].notna()]
    if table.empty or table["agreement"].isna().all():
        return "Too few finished runs for a reading; resume the demo."
    top = table[table["p"] == table["p"].max()].set_index("score")
    keys = [k for k in (*DEMO_SCORES, "random") if k in top.index]
    rows = {k: top.loc[k] for k in keys}
    zeroed = ", ".join(f"{r['label']} {r['realized_pct']:.0f}%" for r in rows.values())
    agree = "; ".join(f"{r['label']} {r['agreement']:.0f}% [{r['agreement_low']:.0f}, {r['agreement_high']:.0f}]"
                      for r in rows.values())
    change = "; ".join(f"{r['label']} {r['difference']:+.1f} [{r['difference_low']:+.1f}, {r['difference_high']:+.1f}]"
                       for r in rows.values())
    best = max(keys, key=lambda k: rows[k]["agreement"])
    ahead = [rows[k]["label"] for k in keys if k != best and rows[k]["agreement_high"] < rows[best]["agreement_low"]]
    behind = [rows[k]["label"] for k in keys if k != best and rows[k]["label"] not in ahead]
    if ahead and not behind:
        verdict = f"{rows[best]['label']} changes fewer answers than {' and '.join(ahead)} beyond sampling error"
    elif ahead:
        verdict = (f"{rows[best]['label']} changes fewer answers than {' and '.join(ahead)} beyond sampling error; "
                   f"{' and '.join(behind)} cannot be told apart from it at this n")
    else:
        verdict = "their intervals overlap, so this sample does not rank the scores"
    n = len(results.records[BASELINE].correct)
    return (
        f"Reading (n = {n} questions, 95% intervals): at p = {top['p'].iloc[0]:g} ({zeroed} of heads zeroed) "
        f"the answers unchanged are {agree}: {verdict}. Accuracy change from the baseline in points: {change}."
    )


def _run_demo(args: argparse.Namespace) -> int:
    import time

    from ..sweep.run import run_sweep
    from ..sweep.config import SweepConfig

    config = SweepConfig(
        model=args.model, task=args.task, subjects=args.subjects, limit=args.limit,
        num_fewshot=DEMO_FEWSHOT[args.task],
        scores=list(DEMO_SCORES), quantiles=list(args.quantiles), batch_size=args.batch_size, dtype=args.dtype,
        device=args.device, n_ctx=args.n_ctx,
    ).validate()
    runs = len(config.run_ids())
    what = f"{args.task.upper()} ({', '.join(config.subjects)})" if config.subjects else args.task.upper()
    print(
        f"inactive-heads demo: {args.model} on real {what}, first {config.limit} questions"
        f"{' of each subject' if config.subjects else ''}, {config.num_fewshot}-shot, chat template as lm-eval "
        "0.4.5 applies it, "
        f"{args.dtype}.\nScores {', '.join(DEMO_SCORES)} + Random, thresholds at p = "
        f"{', '.join(f'{q:g}' for q in config.quantiles)} of each score's pooled CDF: {runs} runs "
        f"into {args.out}/ (p = 0 reuses the baseline; re-run to resume).\n"
    )
    start = time.perf_counter()
    results = run_sweep(config, args.out)
    from ..reporting.report import format_table as results_table
    from ..reporting.report import write_report

    print(results_table(results, runs=True))
    print(f"\nreport: {write_report(args.out)}")
    print("\n" + _demo_reading(results))
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    return 0


register_subcommand("demo", "the paper's experiment in miniature on SmolLM2 and real PIQA (about 4 min on 2 cores)",
                    _add_demo_arguments, _run_demo)
