"""``inactive-heads sweep`` and ``grid``: the resumable sweep, a grid of them, and their
estimates."""

import argparse
from pathlib import Path

from ..core.errors import UserError
from ..core.modules import cwd_on_path
from .options import add_model_arguments, add_task_arguments, positive_int, quantile, scores_argument, tolerance
from .registry import register_subcommand


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    from ..scoring.calibration import DEFAULT_QUANTILES

    from ..evaluation.generation import DECISIONS

    add_model_arguments(parser)
    add_task_arguments(parser, generation=True)
    gen = parser.add_argument_group("generation tasks (gsm8k)")
    gen.add_argument("--decision", choices=DECISIONS, default=None,
                     help="per_step (default): no KV cache, the heads re-decided at every new token (the "
                     "authors' protocol); prompt: decided on the prompt and held, with a KV cache")
    gen.add_argument("--max-gen-toks", type=positive_int, default=None, metavar="N",
                     help="new tokens at most (default 256, the authors')")
    scores_argument(parser, "the paper's 13")
    parser.add_argument("--quantiles", nargs="+", type=quantile, default=list(DEFAULT_QUANTILES),
                        help="p values: thresholds at these fractions of the pooled CDF (default 0 .05 ... .30)")
    from ..pruning.static import RULES

    static = parser.add_argument_group("static runs (one fixed head set per score and p, beside the dynamic runs)")
    static.add_argument("--static-rule", choices=RULES, default=None,
                        help="add static runs: the round(p x heads) heads most often flagged at tau_p (flag_rate) "
                        "or with the most inactive mean score (mean), chosen on --static-calibration")
    static.add_argument("--static-calibration", nargs=2, type=int, default=None, metavar=("FIRST", "END"),
                        help="the questions FIRST..END-1 (of each MMLU subject) that choose the static sets; "
                        "--limit must be <= FIRST, so no question both chooses and scores")
    parser.add_argument("--thresholds", default="calibrated", metavar="calibrated|official:MODEL",
                        help="calibrate on the evaluation inputs (default, as the paper) or use the paper's "
                        "released thresholds for one of its 14 models, e.g. official:meta-llama/Llama-3.2-3B")
    parser.add_argument("--no-random", dest="include_random", action="store_false",
                        help="skip the Random baseline")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Random baseline")
    parser.add_argument("--reuse-prefix", action="store_true",
                        help="compute each shared few-shot prefix once per decision history (MMLU: ~80%% of "
                        "the tokens; GSM8K with --decision per_step: also each step runs only the newest token "
                        "against the cached sequence); the same numbers up to float rounding, not to the bit")
    from ..evaluation.evaluator import ATTENTION_MODES

    parser.add_argument("--attention", choices=ATTENTION_MODES, default="auto",
                        help="auto (default): every pass in TransformerLens's exact arithmetic, so p = 0 "
                        "equals the baseline to the bit; fast: PyTorch's fused kernel where no score reads "
                        "the pattern (numbers within float rounding)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, here and in every Ray worker (e.g. the module whose "
                        "@ih.register_score functions --scores names); repeatable; found on PYTHONPATH or in "
                        "the current folder")
    parser.add_argument("--ablation", dest="ablations", action="append", default=[], metavar="SPEC",
                        help="add one run of this fixed ablation beside the curves: a JSON spec "
                        "('{\"kind\": \"my_kind\", \"k\": 2}'), a registered kind's name, or ablation text "
                        "(static:3.1/5.2, ahon_ln@0.8); repeatable; the module registering a kind goes in --import")
    parser.add_argument("--out", required=True, help="results folder (re-running resumes it)")


def sweep_config(args: argparse.Namespace):
    from ..scoring.scores import PAPER_SCORES
    from ..sweep.config import SweepConfig

    if args.imports:
        cwd_on_path()  # modules beside the user's work (main() did it too; a direct call may not)
    return SweepConfig(
        model=args.model, task=args.task, subjects=args.subjects, limit=args.limit,
        num_fewshot=args.num_fewshot, apply_chat_template=args.apply_chat_template,
        scores=list(args.scores or PAPER_SCORES), quantiles=list(args.quantiles),
        include_random=args.include_random, batch_size=args.batch_size, dtype=args.dtype,
        backend=args.backend, device=args.device, n_ctx=args.n_ctx, seed=args.seed, thresholds=args.thresholds,
        reuse_prefix=args.reuse_prefix, attention=args.attention, imports=list(args.imports),
        decision=args.decision, max_gen_toks=args.max_gen_toks, static_rule=args.static_rule,
        static_calibration=args.static_calibration, ablations=list(args.ablations),
    ).validate()


def _finish(results_dir) -> int:
    from ..reporting.report import format_table as results_table
    from ..reporting.report import write_report

    print(results_table(results_dir))
    print(f"\nreport: {write_report(results_dir)}")
    return 0


def _add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="run here (default) or on Ray actors: embedded on this machine, or a cluster with --address")
    parser.add_argument("--address", default=None, metavar="auto|ray://HOST:PORT",
                        help="join an existing Ray cluster (default: start Ray on this machine)")
    parser.add_argument("--workers", type=int, default=None, help="Ray actors, each loading the model once "
                        "(default: the cluster's CPUs // --threads-per-worker; with --gpus-per-worker, at most "
                        "its GPUs // --gpus-per-worker)")
    parser.add_argument("--gpus-per-worker", type=float, default=None, help="GPUs per Ray actor (e.g. 1, or 0.5)")
    parser.add_argument("--threads-per-worker", type=int, default=None, help="CPU threads per Ray actor (default 1)")


def _add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--estimate", action="store_true",
                        help="time a short sample of real passes here and print the predicted wall time and peak "
                        "memory of the whole run; runs nothing else, writes nothing")
    parser.add_argument("--json", action="store_true",
                        help="with --estimate: print one JSON object (seconds, peak_bytes, projection)")


def _print_estimate(estimate, as_json: bool) -> int:
    if as_json:
        import json

        print(json.dumps(estimate.to_dict()))
    else:
        print(estimate.summary())
    return 0


def _check_estimate_options(args: argparse.Namespace) -> None:
    if args.json and not args.estimate:
        raise UserError("--json applies to --estimate; add --estimate, or drop --json")


def _run_sweep(args: argparse.Namespace) -> int:
    from ..sweep.run import run_sweep

    _check_estimate_options(args)
    config = sweep_config(args)
    ray_options = dict(address=args.address, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                       threads_per_worker=args.threads_per_worker)
    if args.executor == "local" and any(v is not None for v in ray_options.values()):
        raise UserError("--address, --workers, --gpus-per-worker and --threads-per-worker need --executor ray")
    if args.estimate:
        if args.executor != "local":
            raise UserError("--estimate times the local executor on this machine; drop --executor ray to estimate")
        from ..sweep.estimate import estimate_sweep

        return _print_estimate(estimate_sweep(config, args.out), args.json)
    if args.executor == "ray":
        run_sweep(config, args.out, executor="ray", **ray_options)
    else:
        run_sweep(config, args.out)
    return _finish(args.out)


def _add_sweep_command_arguments(parser: argparse.ArgumentParser) -> None:
    _add_sweep_arguments(parser)
    _add_executor_arguments(parser)
    _add_estimate_arguments(parser)


register_subcommand("sweep", "calibrate, then evaluate every (score, threshold) ablation; resumable",
                    _add_sweep_command_arguments, _run_sweep)


def _add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grid_file", metavar="GRID.toml",
                        help="models, tasks and sweep options (see the inactive_heads.sweep.grid docstring)")
    parser.add_argument("--tolerance", type=tolerance, default=1.0, help="accuracy points for 'within' (default 1)")
    _add_estimate_arguments(parser)


def _run_grid(args: argparse.Namespace) -> int:
    from ..sweep.grid import GridConfig, _markdown, run_grid

    _check_estimate_options(args)
    grid = GridConfig.load(args.grid_file)
    if args.estimate:
        from ..sweep.estimate import estimate_grid

        return _print_estimate(estimate_grid(grid), args.json)
    table = run_grid(grid, tolerance=args.tolerance)
    print(_markdown(table))
    print(f"\nwritten: {Path(grid.out) / 'compare.md'}, compare.csv, compare.html")
    return 0


register_subcommand("grid", "run one sweep per (model, task) of a TOML grid and compare them (Table 2 layout)",
                    _add_grid_arguments, _run_grid)
