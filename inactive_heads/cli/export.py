"""``inactive-heads export``: a checkpoint without some heads, zeroed or pruned."""

import argparse

from ..core.errors import UserError
from .registry import register_subcommand


def _fraction(text: str) -> float:
    from ..pruning.static import check_fraction

    try:
        return check_fraction(float(text))
    except (ValueError, UserError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction strictly between 0 and 1 (e.g. 0.3)") from None


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from ..pruning.export import MODES
    from ..pruning.static import RULES

    parser.add_argument("--model", required=True,
                        help="built-in model alias or local Hugging Face directory (the checkpoint to export)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--heads", metavar="FILE", help="a head set written by HeadSet.save (JSON)")
    source.add_argument("--from-sweep", metavar="DIR",
                        help="choose the heads from the scores a calibrated sweep recorded (needs --score, --fraction)")
    source.add_argument("--from-scores", metavar="FILE",
                        help="choose the heads from a HeadScores file (needs --score, --fraction)")
    parser.add_argument("--score", metavar="KEY", help="score that chooses the heads, e.g. ahon_ln")
    parser.add_argument("--fraction", type=_fraction, help="fraction of all heads to remove, in (0, 1)")
    parser.add_argument("--rule", choices=RULES, default="flag_rate",
                        help="flag_rate: most often flagged at the matched quantile (default); mean: most inactive mean score")
    parser.add_argument("--mode", choices=MODES, default="pruned",
                        help="zeroed: W_O columns set to 0, same architecture; pruned: heads removed (default)")
    parser.add_argument("--out", required=True, help="folder to write (must not exist or be empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")


def _run_export(args: argparse.Namespace) -> int:
    from ..pruning.accountant import savings
    from ..pruning.export import export_pruned
    from ..pruning.static import HeadSet, static_heads
    from ..scoring.recording import HeadScores

    if args.heads:
        if args.score or args.fraction is not None:
            raise UserError("--score/--fraction choose heads from scores; with --heads FILE the set is given, drop them")
        head_set = HeadSet.load(args.heads)
    else:
        if not args.score or args.fraction is None:
            raise UserError("choosing heads from scores needs --score KEY and --fraction F (e.g. --score ahon_ln --fraction 0.3)")
        if args.from_sweep:
            from ..sweep.results import sweep_results

            scores = sweep_results(args.from_sweep).head_scores()
        else:
            scores = HeadScores.load(args.from_scores)
        head_set = static_heads(scores, args.score, args.fraction, rule=args.rule)
        print(f"chose {len(head_set)} heads by {args.rule} of {args.score} on {head_set.n_sequences} sequences "
              f"({head_set.source or 'recorded inputs'}); evaluate the export on other questions")
    out = export_pruned(args.model, head_set, args.out, mode=args.mode, overwrite=args.overwrite)
    s = savings(args.model, head_set)
    print(f"{args.mode} export of {args.model} written to {out}: {s.query_heads_removed} of {s.query_heads_total} "
          f"query heads removed, {s.kv_heads_removable} of {s.kv_heads_total} KV heads removable, "
          f"{s.params_removed} of {s.params_total} parameters"
          + (" (removed)" if args.mode == "pruned" else " (zeroed; still stored)"))
    return 0


register_subcommand("export", "write a checkpoint without some heads (zeroed or pruned), loadable by transformers and lm-eval",
                    _add_export_arguments, _run_export)
