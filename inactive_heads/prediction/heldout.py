"""Saved predictors against the in-pass oracle on held-out questions (``predict eval``).

Teacher-forced, the probes read the streams of the oracle's own pass over the task's first
``limit`` questions (of each subject); the held-out questions are those from ``questions_from``
on. Closed loop, every run (the oracle, each predictor as the ablation, the static set and Random
of ``baselines``, and nothing zeroed) is one run of a sweep (:func:`~inactive_heads.sweep.run.run_sweep`)
over the held-out questions alone, with each input's zeroed heads kept (``save_flags``): the
sweep's folder, its resume rule (a finished run is taken, a folder of another setup is refused)
and its records. The precision and recall of a closed-loop run are its saved flags against the
oracle's on the same inputs.
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..ablation.head_ablation import DynamicAblation, RandomAblation, StaticAblation
from ..core.errors import UserError
from ..models.loading import model_info
from ..scoring.scores import get_score
from .oracle import OracleData, _is_generation, collect_task_oracle, plan_question_keys, select
from .probe import Predictor, compare

EVAL_FOLDER = "eval"
"""The sweep folder of ``predict eval``'s closed-loop runs, inside the predictors' folder."""


def evaluate_predictors(model, predictors: dict[str, Predictor], task: str, *, limit: int,
                        questions_from: int | None = None, subjects: list[str] | None = None,
                        num_fewshot: int | None = None, apply_chat_template: bool | None = None,
                        batch_size: int = 8, closed_loop: bool = True, baselines: bool = False,
                        max_gen_toks: int | None = None, hold_groups: float | None = None,
                        progress: bool = False, out: str | Path | None = None,
                        model_name: str | None = None) -> dict[str, Any]:
    """Predictors (by their saved path) against the oracle on the task's questions
    ``questions_from``..``limit - 1`` of each subject, which none of them was fit on. They must
    share one score and threshold (one oracle). ``questions_from``: default the fit's ``limit``
    (what ``predict fit`` saves).

    Teacher-forced: decisions from the features of the oracle's own pass, per layer. Closed loop
    (``closed_loop``): each predictor run as the ablation (:class:`PredictedAblation`), its flags
    compared with the oracle's, and the accuracies of the oracle, the predictors and nothing
    zeroed (``none``) on the held-out questions. ``baselines``: also a static set of the oracle's
    held-out realized fraction (:func:`static_set`) and Random at that fraction (seed 0).
    ``hold_groups=F`` (with ``closed_loop``): each predictor also runs with the group-level rule.

    A generation task (GSM8K): the oracle and the predictors decide on each prompt and hold their
    heads for every generated token (``decision="prompt"``, at most ``max_gen_toks`` new tokens);
    accuracy is strict exact match, the flexible one beside it.

    The closed-loop runs are one sweep into ``out`` (a temporary folder when None): a later call
    with the same setup takes the runs finished there, a folder of another setup is refused with
    one line. ``model_name``: the name the sweep's records give the model (default its own).
    """
    score, threshold = _one_oracle(model, predictors)
    start = time.perf_counter()

    def say(text: str) -> None:
        if progress:
            print(f"predict eval: {text} [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    fit_questions = set().union(*(set(p.config.fit.get("questions", ())) for p in predictors.values()))
    first = _first_heldout(predictors, questions_from)
    config = _sweep_config(model, model_name, task, limit=limit, first=first, subjects=subjects,
                           num_fewshot=num_fewshot, apply_chat_template=apply_chat_template, batch_size=batch_size,
                           max_gen_toks=max_gen_toks)
    saved_fit = next((p.config.fit for p in predictors.values() if "oracle_flag_counts" in p.config.fit), None)
    plan, window = _plan_and_window(model, config, fit_questions, static_from_plan=baselines and saved_fit is None)
    keys = plan_question_keys(plan)
    runs = _closed_loop_runs(score, threshold, predictors, hold_groups) if closed_loop else {}
    if out is not None and (closed_loop or baselines):
        _refuse_another_setup(config, Path(out), [a.to_spec() for a in runs.values()])
    say(f"the oracle's pass for its flags and features ({len(keys)} inputs)")
    data = collect_task_oracle(model, plan, score, threshold, batch_size=batch_size, progress=progress)
    keep = [i in window for i in range(len(keys))]
    held = select(data, keep)
    in_plan = fit_questions & set(data.question_keys)
    result: dict[str, Any] = {
        "score": score, "threshold": threshold, "task": task,
        "n_heldout_sequences": len(held.lengths), "n_heldout_questions": len(set(held.question_keys)),
        "n_fit_questions_in_plan": len(in_plan), "predictors": {},
        **({"decision": "prompt"} if _is_generation(plan) else {}),
    }
    if baselines:
        result["static_set"], heads = static_set(model, data, keep, score, saved_fit if in_plan != fit_questions
                                                 else None, in_plan=len(in_plan), n_fit=len(fit_questions))
        runs["static"] = StaticAblation(heads)
        runs["random"] = RandomAblation(float(held.flags.double().mean()), seed=0)
    records, flags = _run_closed_loop(model, config, plan, runs, out, progress, say) if runs else ({}, {})
    for path, predictor in predictors.items():
        result["predictors"][path] = _predictor_entry(model, predictor, held, records, flags,
                                                      closed_loop=closed_loop, hold_groups=hold_groups)
    result["accuracy"] = {name: _summary(records[name]) for name in [*runs, "none"] if name in records}
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def _plan_and_window(model, config, fit_questions: set[str], *, static_from_plan: bool):
    """The plan of every question up to the limit (the fit's too: the static set may be counted on
    them) and the indices of its held-out inputs, after the checks that need no model pass."""
    from ..sweep.passes import plan_for, question_window

    first, limit = config.questions_from, config.limit
    plan = plan_for(replace(config, questions_from=0), model)
    keys = plan_question_keys(plan)
    if static_from_plan and fit_questions.isdisjoint(keys):
        raise UserError("the static set of --baselines ranks heads by the oracle's flags on the fit questions, "
                        "which this plan does not hold (other subjects?) and the predictor does not save (fit "
                        "before it did); fit it again with predict fit, or drop --baselines")
    window = set(question_window(plan, first))
    if not window:
        raise UserError(f"the task has no question at index {first} or later within the first {limit}; "
                        f"a larger --limit evaluates questions after the fit's first {first}")
    if any(keys[i] in fit_questions for i in window):
        raise UserError(f"questions {first}..{limit - 1} include questions the predictor was fit on; evaluate "
                        "from a later question (questions_from at least the fit's limit)")
    return plan, window


def _closed_loop_runs(score: str, threshold: float, predictors: dict[str, Predictor],
                      hold_groups: float | None) -> dict[str, Any]:
    """The runs known before the oracle's pass, by name: the oracle and each predictor (with the
    group-level rule too, when ``hold_groups``); the static set and Random follow the pass."""
    runs: dict[str, Any] = {"oracle": DynamicAblation(score, threshold)}
    for path, predictor in predictors.items():
        name = f"predicted_lookahead{predictor.lookahead}"
        runs[name] = _predicted(path, predictor, None)
        if hold_groups is not None:
            runs[f"{name}_groups"] = _predicted(path, predictor, hold_groups)
    return runs


def _predicted(path: str, predictor: Predictor, hold_groups: float | None):
    from .ablation import PredictedAblation

    return PredictedAblation(path, hold_groups=hold_groups, digest=predictor.digest())


def _first_heldout(predictors: dict[str, Predictor], questions_from: int | None) -> int:
    """The first held-out question index: ``questions_from``, else the fit's ``limit``."""
    if questions_from is not None:
        if isinstance(questions_from, bool) or not isinstance(questions_from, int) or questions_from < 0:
            raise UserError(f"questions_from must be a question index >= 0, got {questions_from!r}")
        return questions_from
    limits = {p.config.fit.get("limit") for p in predictors.values()}
    if len(limits) != 1 or None in limits:
        raise UserError("the predictors do not say how many questions they were fit on (predict fit saves its "
                        "--limit); pass questions_from=N, the first question index to evaluate")
    return int(limits.pop())


def _sweep_config(model, model_name: str | None, task: str, *, limit: int, first: int, subjects, num_fewshot,
                  apply_chat_template, batch_size: int, max_gen_toks: int | None):
    """The sweep of the closed-loop runs, without its ablations (set once they are known)."""
    from ..evaluation.tasks import task_kind
    from ..sweep.config import SweepConfig

    info = model_info(model)
    generation = task_kind(task) == "generation"
    if subjects is not None:  # as the sweep's validation settles them, so that identities compare
        from ..evaluation.tasks import check_subjects

        subjects = check_subjects(task, list(subjects))
    if max_gen_toks is not None and not generation:
        raise UserError(f"max_gen_toks applies to generation tasks (gsm8k), not {task}; drop it")
    return SweepConfig(model=model_name or info.name, task=task, subjects=subjects, limit=limit,
                       num_fewshot=num_fewshot, apply_chat_template=apply_chat_template, scores=[],
                       include_random=False, batch_size=batch_size, dtype=info.dtype, backend=info.backend,
                       decision="prompt" if generation else None, max_gen_toks=max_gen_toks if generation else None,
                       questions_from=first, save_flags=True)


FIX = "run predict eval with --fresh (which removes it) or delete it"


def _refuse_another_setup(config, folder: Path, known: list[dict[str, Any]]) -> None:
    """Before the oracle's pass: a folder of another eval is refused with one line (the runs
    known before that pass, the oracle's and the predictors', must be the folder's first)."""
    from ..core.resume import check_same_setup
    from ..sweep.folder import stored_config

    stored = stored_config(folder)
    if stored is None:
        return
    have, want = stored.identity(), replace(config, ablations=known).identity()
    have["ablations"] = have["ablations"][:len(known)]
    check_same_setup(folder, have, want, what="sweep", fix=FIX, ignore=("dtype", "device"))


def _run_closed_loop(model, config, plan, runs: dict[str, Any], out, progress: bool, say):
    """Run the closed-loop runs as one sweep into ``out`` on the held-out part of ``plan`` (the
    eval's plan, tokenized once); each run's record and flags by name (``none``: the sweep's
    baseline, which has no flags)."""
    from ..analysis.tables import BASELINE
    from ..sweep.config import ablation_key
    from ..sweep.executors.local import LocalExecutor
    from ..sweep.folder import check_folder, read_flags, read_records
    from ..sweep.passes import questions_from
    from ..sweep.sequence import run_sequence

    specs = {name: ablation.to_spec() for name, ablation in runs.items()}
    config = replace(config, ablations=list(specs.values())).validate()
    heldout = questions_from(plan, config.questions_from, "questions_from")  # what plan_for(config) makes
    with tempfile.TemporaryDirectory(prefix="predict-eval-") as scratch:
        folder = Path(scratch) if out is None else Path(out)
        check_folder(config, folder, fix=FIX)
        say(f"closed-loop runs ({', '.join(runs)}, none) as a sweep in {folder}")
        run_sequence(config, folder, LocalExecutor(config, folder, model=model, progress=progress, plan=heldout))
        records = read_records(folder)
        by_name = {name: ablation_key(spec) for name, spec in specs.items()}
        flags = {name: read_flags(folder, rid) for name, rid in by_name.items()}
        out_records = {name: records[rid] for name, rid in by_name.items()}
        out_records["none"] = records[BASELINE]
    for name, record in out_records.items():
        say(f"{name}: accuracy {100 * record.accuracy:.1f} %")
    return out_records, flags


def _summary(record) -> dict[str, Any]:
    """A run's accuracy, realized fraction and each question's outcome (a generation run's
    flexible match and generated tokens beside them)."""
    summary = {"accuracy": record.accuracy, "realized_fraction": record.realized_fraction, "correct": record.correct}
    if record.decision is not None:
        summary.update(accuracy_flexible=record.accuracy_flexible, correct_flexible=record.correct_flexible,
                       n_generated_tokens=record.n_generated_tokens)
    return summary


def _predictor_entry(model, predictor: Predictor, held: OracleData, records: dict, flags: dict, *,
                     closed_loop: bool, hold_groups: float | None) -> dict[str, Any]:
    """One predictor's entry of ``eval.json``: teacher-forced and closed-loop figures."""
    from ..pruning.accountant import held_fractions, model_shape

    shape = model_shape(model)
    entry: dict[str, Any] = {
        "lookahead": predictor.lookahead, "rank": predictor.config.rank,
        "teacher_forced": compare(predictor.predict(held.features), held.flags).to_dict(),
        "cost_fraction": cost_fraction(model, predictor, held.lengths),
    }
    if closed_loop:
        name = f"predicted_lookahead{predictor.lookahead}"
        entry["closed_loop"] = {**compare(flags[name], held.flags).to_dict(),
                                "kv_groups_held_fraction": held_fractions(shape, flags[name])["kv_groups"]}
        if hold_groups is not None:
            entry["group_level"] = {"hold_groups": hold_groups, "kv_groups_held_fraction":
                                    held_fractions(shape, flags[f"{name}_groups"])["kv_groups"]}
    return entry


def _one_oracle(model, predictors: dict[str, Predictor]) -> tuple[str, float]:
    """The one (score, τ) the predictors share, after checking each fits the model."""
    if not predictors:
        raise UserError("no predictor to evaluate")
    configs = {(p.config.score, p.config.threshold) for p in predictors.values()}
    if len(configs) != 1:
        raise UserError(f"predictors of different oracles {sorted(configs)}; evaluate them one at a time")
    info = model_info(model)
    for predictor in predictors.values():
        predictor.check_model(info.n_layers, info.n_heads, info.d_model, f"model {info.name!r}")
    return next(iter(configs))


def static_set(model, data: OracleData, keep: list[bool], score: str, saved_fit: dict[str, Any] | None, *,
               in_plan: int, n_fit: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The static baseline of an eval: the oracle's held-out realized fraction of heads, ranked by
    :func:`~inactive_heads.pruning.static.static_heads`' rule (``flag_rate``): most often flagged
    by the oracle on the fit questions first, ties by the more inactive mean of the oracle's in-pass
    score there, then by (layer, head). Counted in this pass when the plan holds every fit question
    (``saved_fit`` None), else from what the fit saved (``saved_fit``: a predictor's ``fit``).
    Returns ``eval.json``'s ``static_set`` and the heads."""
    from ..pruning.skipping import held_mask
    from ..pruning.static import inactive_order

    held, fit = select(data, keep), select(data, [not k for k in keep])
    n_heads = data.flags.shape[2]
    if saved_fit is not None:
        counts, counted = torch.tensor(saved_fit["oracle_flag_counts"]).flatten(), "the fit's saved counts"
        means = saved_fit.get("oracle_score_means")
        means = None if means is None else torch.tensor(means, dtype=torch.float64).flatten()
    else:
        counts, means = fit.flags.sum(dim=0).flatten(), fit.scores.double().mean(dim=0).flatten()
        counted = "this plan's fit questions" if in_plan == n_fit else f"this plan's {in_plan} of the {n_fit} fit questions"
    if means is None:  # a predictor saved before the means were: ties by (layer, head)
        means, counted = torch.zeros(counts.numel(), dtype=torch.float64), f"{counted} (ties by layer and head)"
    inactive_first = means if get_score(score).direction == "below" else -means
    k = int(round(float(held.flags.double().mean()) * counts.numel()))
    top = inactive_order(-counts.double(), inactive_first)[:k].tolist()
    heads = [(i // n_heads, i % n_heads) for i in top]
    # the per-input decision's yardstick: the same heads on every input, against the oracle
    return ({"n_heads": len(heads), "heads": [list(h) for h in heads], "ranked_by": counted,
             "vs_oracle": compare(held_mask(model, heads, held.flags.shape[0]), held.flags).to_dict()}, heads)


def cost_fraction(model, predictor: Predictor, lengths: list[int]) -> dict[str, Any]:
    """The probe's multiply-adds per sequence and layer as a fraction of the layer's (FLOP model),
    at the mean and the shortest sequence length of these inputs (short sequences cost most)."""
    from ..pruning.accountant import model_shape

    shape = model_shape(model)
    mean_len = round(sum(lengths) / len(lengths))
    return {"mean_seq_len": mean_len, "at_mean_len": predictor.cost_fraction(shape, mean_len),
            "min_seq_len": min(lengths), "at_min_len": predictor.cost_fraction(shape, min(lengths))}
