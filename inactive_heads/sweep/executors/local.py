"""The local executor: one model, loaded once (or passed in), the inputs tokenized once for all runs."""

from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ...analysis.tables import BASELINE
from ...core.io import write_json_atomic
from ...scoring.calibration import Thresholds
from ...scoring.scores import STATIC_SUFFIX
from ..config import SweepConfig, ablation_for, run_id, run_threshold
from ...ablation.head_ablation import ablation_from_spec
from ..folder import STATIC_HEADS_FILE, STATIC_SCORES_FILE, make_record, write_flags, write_record
from ..passes import (
    calibration_plan,
    check_model_matches,
    evaluate_run,
    load_model_for,
    plan_for,
    record_prompt_scores,
    resolved_for,
)


class LocalExecutor:
    """Runs every pass of a sweep in this process (:class:`~inactive_heads.sweep.sequence.Executor`).
    ``model``, when given, must be the model ``config.model`` names; ``plan``, when given, the
    inputs :func:`~inactive_heads.sweep.passes.plan_for` makes for ``config`` on it (a caller that
    has tokenized them already, so they are tokenized once)."""

    def __init__(self, config: SweepConfig, out: Path, *, model=None, progress: bool = True, plan=None):
        self.config, self.out, self.model, self.progress = config, out, model, progress
        self.plan = plan

    def start(self) -> SweepConfig:
        if self.model is None:
            self.model = load_model_for(self.config, self.progress)
        else:
            check_model_matches(self.config, self.model)
        # The inputs first: a task the model cannot be prompted with (e.g. WinoGrande 0-shot with a
        # chat template) fails before sweep.json is written, leaving the folder as it was.
        if self.plan is None:
            self.plan = plan_for(self.config, self.model)
        return resolved_for(self.config, self.model)

    def baseline(self, scores: bool, record: bool):
        config, model, plan = self.config, self.model, self.plan
        if scores and not record and config.is_generation:  # the scores alone: no generation
            return record_prompt_scores(config, model, plan, config.scores, self.progress)
        result = evaluate_run(config, model, plan, None, progress=self.progress,
                              record=list(config.scores) if scores else None)
        if record:
            write_record(self.out, make_record(config, BASELINE, None, None, None, result, plan, model))
        return result.head_scores if scores else None

    def runs(self, todo: list[tuple[str, str, float | None]], thresholds: dict[str, Thresholds]) -> None:
        config, out, model, plan = self.config, self.out, self.model, self.plan
        static_sets = static_head_sets(config, out, model, self.progress) if any(
            key.endswith(STATIC_SUFFIX) for _, key, _ in todo) else {}
        bar = sweep_bar(config, plan, len(todo), self.progress)
        for done, (rid, key, q) in enumerate(todo):
            bar.set_postfix_str(f"run {done + 1}/{len(todo)}: {rid}")
            heads = static_sets.get(rid)
            tau = heads.threshold if heads is not None else run_threshold(thresholds, key, q)
            spec = ablation_for(config, key, tau, heads)
            ablation = ablation_from_spec(spec) if config.save_flags else spec  # kept: its flags are read
            result = evaluate_run(config, model, plan, ablation, progress=self.progress,
                                  bar=None if config.is_generation else bar)
            if config.save_flags:
                write_flags(out, rid, run_flags(config, plan, result, ablation))
            write_record(out, make_record(config, rid, key, q, tau, result, plan, model, heads))
            if config.is_generation:
                bar.update(1)
        bar.close()

    def close(self) -> None:
        pass


def run_flags(config: SweepConfig, plan, result, ablation):
    """Each input's zeroed heads in one ablated run, [input, layer, head], in the plan's order:
    the evaluator's per-input flags, or for a generation task (decision "prompt") each prompt's."""
    if config.is_generation:
        return ablation.stats.flagged_mask(n=len(plan))
    if result.flagged is None:
        from ...core.errors import UserError

        raise UserError(f"the ablation {ablation.to_spec()} kept no zeroed heads per input, so save_flags has "
                        "nothing to write; drop save_flags for it")
    return result.flagged


def sweep_bar(config: SweepConfig, plan, runs: int, progress: bool):
    """One bar over the sweep's pending runs, with its ETA: for log-likelihood tasks in inputs
    (runs x inputs, advanced per batch), for generation tasks in runs."""
    if config.is_generation:
        return tqdm(total=runs, desc="sweep runs", unit="run", disable=not progress)
    return tqdm(total=runs * len(plan.inputs), desc=f"sweep ({runs} runs x {len(plan.inputs)} inputs)",
                unit="seq", disable=not progress)


def static_head_sets(config: SweepConfig, out: Path, model, progress: bool) -> dict[str, Any]:
    """The head set of every static run, by run id: ``static_heads`` of scores recorded (nothing
    zeroed) on the calibration questions, kept in ``static_scores.safetensors`` for resumes; the
    sets are written to ``static_heads.json`` (``HeadSet`` dicts, for export and StaticAblation)."""
    from ...pruning.static import static_heads
    from ...scoring.recording import HeadScores, record_scores

    path = out / STATIC_SCORES_FILE
    if path.is_file():
        head_scores = HeadScores.load(path)
    else:
        plan = calibration_plan(config, model)
        first, end = config.static_calibration
        head_scores = record_scores(model, plan.inputs, list(config.scores), batch_size=config.batch_size,
                                    progress=progress, description=f"{config.task} questions {first}..{end - 1} "
                                    f"(static calibration, {len(plan.inputs)} inputs)")
        head_scores.save(path)
    sets = {}
    for key in config.scores:
        for q in config.quantiles:
            if q > 0:
                sets[run_id(key + STATIC_SUFFIX, q)] = static_heads(head_scores, key, q, rule=config.static_rule)
    write_json_atomic(out / STATIC_HEADS_FILE, {rid: hs.to_dict() for rid, hs in sets.items()})
    return sets
