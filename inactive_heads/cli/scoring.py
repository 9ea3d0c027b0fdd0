"""``inactive-heads score`` and ``calibrate``: record head scores, then quantile thresholds."""

import argparse
from pathlib import Path

from . import options
from .options import add_model_arguments, add_task_arguments, quantile, scores_argument, table
from .registry import register_subcommand


def _add_score_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_task_arguments(parser)
    parser.add_argument("--text-file", help="score this text instead of the task's prompts "
                        "(passages separated by blank lines)")
    scores_argument(parser, "every registered score")
    parser.add_argument("--out", default="scores.safetensors", help="where to save the HeadScores (default scores.safetensors)")


def _run_score(args: argparse.Namespace) -> int:
    from ..scoring.recording import record_scores
    from ..scoring.scores import get_score

    # Bad input fails before the model loads (seconds to minutes): score keys, the text file or
    # the task's documents (task, subjects, limit).
    for key in args.scores or ():
        get_score(key)
    if args.text_file:
        from ..evaluation.texts import read_text_file

        inputs, description = read_text_file(args.text_file), f"text file {args.text_file}"
    else:
        from ..evaluation.registry import check_task_options

        check_task_options(args.task, subjects=args.subjects, limit=args.limit)
    model = options.load(args)  # looked up at call time: tests replace it
    if not args.text_file:
        from ..evaluation.registry import plan_for_task  # built-in and lm-eval:<task> alike

        plan = plan_for_task(model, args.task, subjects=args.subjects, limit=args.limit,
                             num_fewshot=args.num_fewshot, apply_chat_template=args.apply_chat_template)
        inputs, description = plan.inputs, f"{args.task} evaluation inputs"
    hs = record_scores(model, inputs, args.scores, batch_size=args.batch_size, description=description)
    path = hs.save(args.out)
    rows = []
    for key in hs.keys():
        t = hs[key]
        rows.append((key, get_score(key).label, get_score(key).direction, f"{t.mean():.4g}",
                     f"{t.min():.4g}", f"{t.max():.4g}"))
    print(table(rows, ("key", "label", "inactive if", "mean", "min", "max")))
    print(f"\n{hs.n_sequences} sequences x {hs.n_layers} layers x {hs.n_heads} heads saved to {path}")
    return 0


register_subcommand("score", "record head scores (no ablation) and save them", _add_score_arguments, _run_score)


# ----------------------------------------------------------------------------------------------
# calibrate


def _add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from ..scoring.calibration import DEFAULT_QUANTILES

    parser.add_argument("scores_file", metavar="SCORES.safetensors", help="file written by 'inactive-heads score'")
    scores_argument(parser, "every score in the file")
    parser.add_argument("--quantiles", nargs="+", type=quantile, default=list(DEFAULT_QUANTILES),
                        help="fractions p of the pooled CDF (default 0 .05 .10 .15 .20 .25 .30)")
    parser.add_argument("--out", help="also write the thresholds as JSON here")


def _run_calibrate(args: argparse.Namespace) -> int:
    from ..scoring.calibration import calibrate_on
    from ..scoring.recording import HeadScores
    from ..scoring.scores import get_score
    from ..core.io import write_json_atomic

    hs = HeadScores.load(args.scores_file)
    keys = args.scores or hs.keys()
    thresholds = {key: calibrate_on(None, hs, key, args.quantiles) for key in keys}  # scores recorded already
    header = ("key", "inactive if") + tuple(f"p={q:g}" for q in args.quantiles)
    rows = [(k, ("> " if t.direction == "above" else "< ") + "tau", *[f"{v:.4g}" for v in t.values])
            for k, t in thresholds.items()]
    print(table(rows, header))
    print(f"\nthresholds from {hs.n_sequences} sequences ({get_score(keys[0]).label} ... pooled over "
          f"{hs.n_layers} layers x {hs.n_heads} heads)")
    if args.out:
        write_json_atomic(Path(args.out), {k: t.to_dict() for k, t in thresholds.items()})
        print(f"written to {args.out}")
    return 0


register_subcommand("calibrate", "quantile thresholds from recorded scores (pooled CDF, as in the paper)",
                    _add_calibrate_arguments, _run_calibrate)
