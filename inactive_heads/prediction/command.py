"""``inactive-heads predict fit|eval``: the command's options and logic (``cli.py`` registers it).

``fit`` calibrates τ on the first ``--limit`` questions (nothing zeroed), runs the in-pass oracle
on them, fits one predictor per ``--lookahead`` and saves each to ``OUT/lookahead-K/``. For a
generation task (GSM8K) the questions' inputs are their prompts, where ``decision="prompt"``
decides the heads it holds while generating.
``eval DIR`` runs the oracle on the first ``--limit`` questions *after* the fit's (the plan is
built for fit + limit questions; the held-out ones are each subject's questions from the fit's
limit on) and prints, per predictor, per-layer precision and recall against the oracle with the
realized fractions. The closed-loop runs are one sweep into ``DIR/eval/``
(:mod:`~inactive_heads.prediction.heldout`): an eval of the same setup that is started again takes
the runs finished there; a folder of another setup is refused, as any sweep's is (``--fresh``
removes it and runs them all again). Both hold the folder's
:class:`~inactive_heads.core.lock.FolderLock` while they write: a second fit or eval on it stops.
"""

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ..core.errors import UserError
from ..core.io import write_json_atomic
from ..core.lock import FolderLock
from ..core.text import text_table
from .probe import CONFIG_FILE, FitOptions, Predictor

def add_arguments(parser: argparse.ArgumentParser, *, model_arguments: Callable, task_arguments: Callable,
                  positive_int: Callable, quantile: Callable) -> None:
    """``fit`` and ``eval`` subcommands; the shared model/task option groups come from the CLI."""
    sub = parser.add_subparsers(dest="predict_command", metavar="{fit,eval}")
    sub.required = True
    fit = sub.add_parser("fit", help="fit predictors of the in-pass oracle on a task's first questions",
                         description="fit predictors of the in-pass oracle on a task's first --limit questions")
    model_arguments(fit)
    task_arguments(fit, default_task="piqa", generation=True)
    fit.add_argument("--score", default="ahon_ln", help="score key of the oracle (default ahon_ln)")
    which = fit.add_mutually_exclusive_group()
    which.add_argument("--p", type=quantile, default=None,
                       help="quantile of the score calibrated on the fit questions, nothing zeroed (default 0.1)")
    which.add_argument("--threshold", type=float, default=None, help="use this τ instead of calibrating one")
    fit.add_argument("--lookahead", type=int, nargs="+", choices=(0, 1), default=[0],
                     help="0: the stream entering the layer; 1: entering the layer before (default 0)")
    fit.add_argument("--rank", type=positive_int, default=FitOptions.rank, help="probe rank (default 16)")
    fit.add_argument("--steps", type=positive_int, default=FitOptions.steps, help="Adam steps per layer (default 300)")
    fit.add_argument("--out", required=True, help="folder for the predictors (OUT/lookahead-K/)")
    ev = sub.add_parser("eval", help="precision/recall of saved predictors against the oracle on held-out questions",
                        description="precision/recall of saved predictors against the oracle on held-out questions")
    ev.add_argument("dir", help="a folder from predict fit (or one predictor's lookahead-K folder)")
    model_arguments(ev)
    ev.set_defaults(model=None, dtype=None)
    ev._option_string_actions["--dtype"].help = (
        "weights and activations dtype (default: the fit's, as predictor.json saved it; auto for a predictor "
        "saved without it: the model's config dtype on a GPU, float32 on the CPU)")
    task_arguments(ev, default_task=None, generation=True)
    ev.add_argument("--max-gen-toks", type=positive_int, default=None, metavar="N",
                    help="generation tasks (gsm8k): new tokens at most (default 256, the authors')")
    ev.add_argument("--no-closed-loop", dest="closed_loop", action="store_false",
                    help="skip running the predictor as the ablation (teacher-forced figures only)")
    ev.add_argument("--baselines", action="store_true",
                    help="also evaluate a static set and Random at the oracle's realized fraction")
    ev.add_argument("--hold-groups", type=_group_fraction, default=None, metavar="F",
                    help="also run each predictor with the group-level rule: a KV group at least F of whose "
                    "query heads are held is held whole (e.g. 0.5)")
    ev.add_argument("--fresh", action="store_true",
                    help="run every run again, removing DIR/eval (the finished runs of an earlier eval of the same "
                    "setup, or of another setup, which is refused otherwise)")
    ev.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")


def _group_fraction(text: str) -> float:
    from ..pruning.skipping import check_group_fraction

    try:
        return check_group_fraction(float(text), "--hold-groups")
    except (ValueError, UserError) as exc:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] (e.g. 0.5), got {text!r}") from exc


def predictor_dirs(path) -> list[Path]:
    """The predictor folders in ``path``: itself if it holds one, else its ``lookahead-*`` folders."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return [path]
    found = sorted(p for p in path.glob("lookahead-*") if (p / CONFIG_FILE).is_file())
    if not found:
        raise UserError(f"no predictor in {path}: expected {CONFIG_FILE} there or in its lookahead-K folders "
                        "(written by `inactive-heads predict fit --out`)")
    return found


def run(args: argparse.Namespace, *, load: Callable) -> int:
    if args.predict_command == "fit":
        return _fit(args, load)
    return _eval(args, load)


def _plan(model, args, limit: int | None):
    """The task's requests: a multiple-choice plan, or a generation task's prompts (GSM8K)."""
    from ..evaluation.registry import plan_for_task

    return plan_for_task(model, args.task, subjects=args.subjects, limit=limit, num_fewshot=args.num_fewshot,
                         apply_chat_template=args.apply_chat_template)


def _fit(args, load) -> int:
    if args.limit is None:
        raise UserError("predict fit needs --limit N: the first N questions are the fit split (predict eval "
                        "uses the ones after them)")
    from ..scoring.scores import get_score

    get_score(args.score)  # a wrong score or output folder fails now, not after the passes
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the predictors (they go to OUT/lookahead-K/)")
    with FolderLock(out, work="predict fit"):
        return _fit_into(args, load, out)


def _fit_into(args, load, out: Path) -> int:
    from ..models.loading import model_info
    from .oracle import calibrated_threshold, collect_task_oracle, fit_from_oracle

    lookaheads = sorted(set(args.lookahead))
    model = load(args)
    plan = _plan(model, args, args.limit)
    p = None if args.threshold is not None else (args.p if args.p is not None else 0.1)
    threshold = args.threshold if args.threshold is not None else calibrated_threshold(
        model, plan, args.score, p, batch_size=args.batch_size, progress=True)
    data = collect_task_oracle(model, plan, args.score, threshold, batch_size=args.batch_size, progress=True)
    for lookahead in lookaheads:
        predictor = fit_from_oracle(data, model=args.model, score=args.score, threshold=threshold,
                                    lookahead=lookahead, options=FitOptions(rank=args.rank, steps=args.steps),
                                    task=args.task, p=p)
        predictor.config.fit.update({"limit": args.limit, "subjects": args.subjects, "num_fewshot": args.num_fewshot,
                                     "dtype": model_info(model).dtype})
        where = predictor.save(out / f"lookahead-{lookahead}")
        m = predictor.config.fit["metrics"]
        print(f"lookahead {lookahead}: {where} — fit split n={m['n_sequences']} sequences, τ={threshold:.6g}, "
              f"oracle {100 * m['oracle_fraction']:.2f}% held, predicted {100 * m['predicted_fraction']:.2f}%, "
              f"mean precision {m['mean_precision']:.3f}, mean recall {m['mean_recall']:.3f}")
    return 0


def _eval(args, load) -> int:
    dirs = predictor_dirs(args.dir)
    base = Path(args.dir)
    folder = base if base.is_dir() else base.parent
    with FolderLock(folder, work="predict eval"):
        return _eval_in(args, load, dirs, folder)


def _eval_in(args, load, dirs: list[Path], folder: Path) -> int:
    from .heldout import EVAL_FOLDER, evaluate_predictors

    predictors = {str(d.resolve()): Predictor.load(d) for d in dirs}
    first = next(iter(predictors.values())).config
    task = args.task or first.task
    if task is None:
        raise UserError("the predictor does not name its task; pass --task")
    if args.limit is None:
        raise UserError("predict eval needs --limit N: the held-out questions after the fit's first ones")
    if args.hold_groups is not None and not args.closed_loop:
        raise UserError("--hold-groups runs each predictor as an ablation; drop --no-closed-loop")
    args.task = task
    if args.model is None:
        args.model = first.model
    fit_limit = first.fit.get("limit") or 0
    if args.subjects is None:
        args.subjects = first.fit.get("subjects")
    if args.num_fewshot is None:
        args.num_fewshot = first.fit.get("num_fewshot")
    if args.dtype is None:  # the features the probes read depend on it: the fit's unless told otherwise
        args.dtype = first.fit.get("dtype") or "auto"
    model = load(args)
    runs = folder / EVAL_FOLDER
    if args.fresh and runs.exists():
        _remove_eval_sweep(runs)
    result = evaluate_predictors(model, predictors, task, limit=fit_limit + args.limit, questions_from=fit_limit,
                                 subjects=args.subjects, num_fewshot=args.num_fewshot,
                                 apply_chat_template=args.apply_chat_template, batch_size=args.batch_size,
                                 closed_loop=args.closed_loop, baselines=args.baselines,
                                 max_gen_toks=args.max_gen_toks, hold_groups=args.hold_groups, progress=True,
                                 out=runs, model_name=args.model)
    write_json_atomic(folder / "eval.json", result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(format_eval(result))
    return 0


def _remove_eval_sweep(runs: Path) -> None:
    """``--fresh``: remove the folder of an earlier eval's runs, if it is one (a sweep folder)."""
    import shutil

    if not (runs / "sweep.json").is_file():
        raise UserError(f"--fresh removes {runs}, the runs of an earlier predict eval, but it holds no sweep.json; "
                        "move it away first")
    shutil.rmtree(runs)


def _pct(x) -> str:
    return "—" if x != x else f"{100 * x:.1f}"


def _num(x) -> str:
    return "—" if x != x else f"{x:.3f}"


def format_eval(result: dict) -> str:
    """Per predictor: the per-layer table (oracle and predicted held %, precision, recall; teacher-
    forced and, when run, closed loop), then the means; then accuracies."""
    lines = [f"{result['task']}: oracle {result['score']} τ={result['threshold']:.6g}; held-out "
             f"{result['n_heldout_questions']} questions ({result['n_heldout_sequences']} sequences)"]
    for path, entry in result["predictors"].items():
        tf, cl = entry["teacher_forced"], entry.get("closed_loop")
        header = ["layer", "oracle %", "pred %", "precision", "recall"]
        if cl:
            header += ["loop pred %", "loop prec", "loop recall"]
        rows = []
        for l in range(len(tf["precision"])):
            row = [str(l), _pct(tf["oracle_fraction"][l]), _pct(tf["predicted_fraction"][l]),
                   _num(tf["precision"][l]), _num(tf["recall"][l])]
            if cl:
                row += [_pct(cl["predicted_fraction"][l]), _num(cl["precision"][l]), _num(cl["recall"][l])]
            rows.append(row)
        s = tf["summary"]
        mean = ["mean", _pct(s["oracle_fraction"]), _pct(s["predicted_fraction"]), _num(s["mean_precision"]),
                _num(s["mean_recall"])]
        if cl:
            c = cl["summary"]
            mean += [_pct(c["predicted_fraction"]), _num(c["mean_precision"]), _num(c["mean_recall"])]
        rows.append(mean)
        cost = entry["cost_fraction"]
        lines += ["", f"{path} (lookahead {entry['lookahead']}, rank {entry['rank']})", text_table(header, rows),
                  f"pooled over layers: precision {_num(s['micro_precision'])}, recall {_num(s['micro_recall'])}"
                  + (f"; closed loop {_num(cl['summary']['micro_precision'])}, {_num(cl['summary']['micro_recall'])}"
                     if cl else ""),
                  *([f"KV groups wholly held (freed by a real skip): {_pct(cl.get('kv_groups_held_fraction', float('nan')))}%"
                     + (f"; with the group-level rule at {entry['group_level']['hold_groups']:g}: "
                        f"{_pct(entry['group_level']['kv_groups_held_fraction'])}%" if "group_level" in entry else "")]
                    if cl else []),
                  f"probe cost: {100 * cost['at_mean_len']:.3f}% of a layer's multiply-adds at the mean length "
                  f"{cost['mean_seq_len']} tokens ({100 * cost['at_min_len']:.3f}% at the shortest, {cost['min_seq_len']})"]
    if "static_set" in result:
        static = result["static_set"]
        s = static["vs_oracle"]["summary"]
        ranked = f", ranked by {static['ranked_by']}" if "ranked_by" in static else ""  # older eval.json: not saved
        lines += ["", f"static set of the same size ({static['n_heads']} heads, held on every input{ranked}) "
                  f"against the oracle: mean precision {_num(s['mean_precision'])}, recall {_num(s['mean_recall'])}; "
                  f"pooled {_num(s['micro_precision'])}, {_num(s['micro_recall'])}"]
    if result.get("accuracy"):
        lines += ["", accuracy_table(result["accuracy"])]
    return "\n".join(lines)


def accuracy_table(accuracy: dict) -> str:
    """Each run's accuracy with its 95 % bootstrap interval over the held-out questions, its held
    fraction, and its paired difference from the oracle and from the run with nothing zeroed."""
    from ..analysis.bootstrap import accuracy_interval
    from ..analysis.paired import difference_interval

    def interval(iv) -> str:
        return f"{iv.estimate:+.2f} [{iv.low:+.1f}, {iv.high:+.1f}]"

    rows = []
    for name, a in accuracy.items():
        ci = accuracy_interval(a["correct"])
        row = [name, f"{ci.estimate:.2f} [{ci.low:.1f}, {ci.high:.1f}]", f"{100 * a['realized_fraction']:.2f}"]
        for ref in ("oracle", "none"):
            row.append(interval(difference_interval(a["correct"], accuracy[ref]["correct"]))
                       if ref in accuracy and ref != name else "—")
        rows.append(row)
    return text_table(["run", "accuracy % [95% CI]", "held %", "Δ vs oracle (paired)", "Δ vs none (paired)"], rows)
