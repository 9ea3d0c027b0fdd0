"""The paper's experiment: calibrate thresholds, then evaluate every (score, threshold) ablation.

A sweep writes one results folder::

    sweep.json        the SweepConfig that produced it (re-running checks it matches)
    scores.pt         HeadScores recorded without ablation on the evaluation inputs themselves
    thresholds.json   one Thresholds per score (quantiles of the pooled CDF, or the paper's preset)
    runs/<id>.json    one record per finished run, written atomically the moment it finishes

Re-running the same command skips finished runs, so an interrupted sweep loses nothing.
"""

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .ablation import AblationSpec
from .calibration import DEFAULT_QUANTILES, Thresholds, calibrate, official_thresholds
from .io import write_json_atomic
from .models import BACKENDS, DEFAULT_MODEL
from .scores import PAPER_SCORES, get_score

DTYPES = ("float32", "bfloat16", "float16")
BASELINE = "baseline"


@dataclass
class SweepConfig:
    """Everything that defines a sweep; round-trips to JSON (``sweep.json``) and backs the CLI.

    ``thresholds="calibrated"`` takes quantiles of scores recorded on the evaluation inputs
    (as the paper does); ``"official:<model>"`` uses the paper's released thresholds for one of
    its 14 models (keys of ``calibration.official_models()``).
    """

    model: str = DEFAULT_MODEL
    task: str = "mmlu"
    subjects: list[str] | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    apply_chat_template: bool | None = None
    scores: list[str] = field(default_factory=lambda: list(PAPER_SCORES))
    quantiles: list[float] = field(default_factory=lambda: list(DEFAULT_QUANTILES))
    include_random: bool = True
    batch_size: int = 8
    dtype: str = "float32"
    backend: str = "hooked"
    seed: int = 0
    thresholds: str = "calibrated"
    source: str | None = None

    def __post_init__(self):
        from .tasks import TASKS

        if self.task not in TASKS:
            raise ValueError(f"unknown task '{self.task}'; known: {', '.join(TASKS)}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be a positive integer, got {self.limit!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype '{self.dtype}'; use one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend '{self.backend}'; use one of {', '.join(BACKENDS)}")
        self.scores = [s for s in self.scores if s != "random"]
        if not self.scores and not self.include_random:
            raise ValueError("the sweep has no score functions; pass some scores or keep Random")
        for key in self.scores:
            get_score(key)
        if not self.quantiles or any(not 0 <= q < 1 for q in self.quantiles):
            raise ValueError(f"quantiles must be numbers in [0, 1), got {self.quantiles!r}")
        if self.thresholds != "calibrated" and not self.thresholds.startswith("official:"):
            raise ValueError(
                f"thresholds must be 'calibrated' or 'official:<model>', got {self.thresholds!r}"
            )
        if self.subjects is not None:
            from .tasks import MMLU_SUBJECTS

            self.subjects = list(self.subjects)
            if self.task != "mmlu":
                raise ValueError(f"subjects apply to MMLU only; remove them for task '{self.task}'")
            unknown = [s for s in self.subjects if s not in MMLU_SUBJECTS]
            if unknown:
                raise ValueError(
                    f"unknown MMLU subject '{unknown[0]}'; valid subjects are listed in "
                    "inactive_heads.tasks.MMLU_SUBJECTS (e.g. abstract_algebra, anatomy, astronomy)"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sweep option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def run_ids(self) -> list[tuple[str, str | None, float | None]]:
        """(run id, score key, quantile) for every run, baseline first."""
        ids: list[tuple[str, str | None, float | None]] = [(BASELINE, None, None)]
        keys = list(self.scores) + (["random"] if self.include_random else [])
        for key in keys:
            for q in self.quantiles:
                ids.append((f"{key}@p={q:.2f}", key, q))
        return ids


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _thresholds_for(config: SweepConfig, key: str, head_scores) -> Thresholds:
    if config.thresholds.startswith("official:"):
        model_name = config.thresholds.split(":", 1)[1]
        t = official_thresholds(model_name, config.task, key)
        picked = [t.at(q) for q in config.quantiles]
        return Thresholds(key, tuple(config.quantiles), tuple(picked), t.direction, t.source, t.n_scores)
    return calibrate(head_scores, key, config.quantiles)


def run_sweep(
    config: SweepConfig,
    out_dir: str | os.PathLike,
    *,
    model=None,
    progress: bool = True,
) -> "SweepResults":
    """Run (or resume) a sweep into ``out_dir``; returns its :class:`SweepResults`.

    The model is loaded once and the task tokenized once for all runs. Pass ``model`` to reuse
    one already loaded (it must be the model ``config.model`` names).
    """
    from .evaluate import evaluate, plan_evaluation
    from .models import load_model
    from .recording import HeadScores, record_scores

    out = Path(out_dir)
    config_path = out / "sweep.json"
    if config_path.is_file():
        existing = json.loads(config_path.read_text())
        if existing != config.to_dict():
            differing = sorted(k for k in config.to_dict() if existing.get(k) != config.to_dict()[k])
            raise ValueError(
                f"'{out}' holds a different sweep (differs in {', '.join(differing)}); "
                "use another --out folder or delete it"
            )
    write_json_atomic(config_path, config.to_dict())

    if model is None:
        model = load_model(config.model, backend=config.backend, dtype=_torch_dtype(config.dtype),
                           progress=progress)
    plan = plan_evaluation(
        model,
        config.task,
        subjects=config.subjects,
        limit=config.limit,
        num_fewshot=config.num_fewshot,
        apply_chat_template=config.apply_chat_template,
        source=config.source,
    )

    scores_path = out / "scores.pt"
    if config.scores and config.thresholds == "calibrated":
        if scores_path.is_file():
            head_scores = HeadScores.load(scores_path)
        else:
            head_scores = record_scores(
                model, plan.inputs, config.scores, batch_size=config.batch_size, progress=progress,
                seed=config.seed, description=f"{config.task} evaluation inputs ({len(plan.inputs)})",
            )
            head_scores.save(scores_path)
    else:
        head_scores = None

    thresholds_path = out / "thresholds.json"
    keys = list(config.scores) + (["random"] if config.include_random else [])
    thresholds = {key: _thresholds_for(config, key, head_scores) for key in keys}
    write_json_atomic(thresholds_path, {k: t.to_dict() for k, t in thresholds.items()})

    runs = config.run_ids()
    runs_dir = out / "runs"
    todo = [r for r in runs if not (runs_dir / f"{r[0]}.json").is_file()]
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="sweep runs", unit="run",
               disable=not progress)
    for run_id, key, q in todo:
        bar.set_postfix_str(run_id)
        if key is None:
            spec, tau = None, None
        else:
            tau = thresholds[key].at(q)
            if key == "random":
                spec = AblationSpec("random", threshold=tau, seed=config.seed)
            else:
                spec = AblationSpec("dynamic", score=key, threshold=tau, seed=config.seed)
        result = evaluate(model, plan, ablation=spec, batch_size=config.batch_size, progress=progress)
        record = {
            "run_id": run_id,
            "score": key,
            "label": get_score(key).label if key else "No ablation",
            "p": q,
            "threshold": tau,
            "accuracy": result.accuracy,
            "accuracy_percent": 100 * result.accuracy,
            "acc_norm": result.acc_norm,
            "realized_fraction": result.realized_fraction,
            "realized_percent": 100 * result.realized_fraction,
            "realized_fraction_per_layer": result.realized_fraction_per_layer,
            "n": result.n,
            "n_forward_sequences": result.n_forward_sequences,
            "correct": result.correct,
            "per_subject": result.per_subject,
            "seconds": result.seconds,
            "ablation": spec.to_dict() if spec else None,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        write_json_atomic(runs_dir / f"{run_id}.json", record)
        bar.update(1)
    bar.close()
    return SweepResults.load(out)


@dataclass
class SweepResults:
    """A finished (or partial) sweep read back from its folder, ready for analysis and plots."""

    path: Path
    config: SweepConfig
    thresholds: dict[str, Thresholds]
    records: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SweepResults":
        path = Path(path)
        config_path = path / "sweep.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"'{path}' is not a sweep results folder (no sweep.json); run a sweep first")
        config = SweepConfig.from_dict(json.loads(config_path.read_text()))
        thresholds = {}
        if (path / "thresholds.json").is_file():
            raw = json.loads((path / "thresholds.json").read_text())
            thresholds = {k: Thresholds.from_dict(v) for k, v in raw.items()}
        records = {}
        for f in sorted((path / "runs").glob("*.json")):
            rec = json.loads(f.read_text())
            records[rec["run_id"]] = rec
        return cls(path, config, thresholds, records)

    @property
    def baseline_percent(self) -> float:
        """Accuracy (%) of the nothing-zeroed run."""
        if BASELINE not in self.records:
            raise ValueError(f"the sweep in '{self.path}' has no baseline run yet; resume it")
        return self.records[BASELINE]["accuracy_percent"]

    @property
    def score_keys(self) -> list[str]:
        keys = []
        for rec in self.records.values():
            if rec["score"] and rec["score"] not in keys:
                keys.append(rec["score"])
        order = self.config.scores + ["random"]
        return sorted(keys, key=lambda k: order.index(k) if k in order else len(order))

    def curves(self, metric: str = "accuracy_percent") -> dict[str, list[tuple[float, float]]]:
        """Per score: (realized % zeroed, metric) points sorted by realized %."""
        out: dict[str, list[tuple[float, float]]] = {}
        for rec in self.records.values():
            if rec["score"]:
                out.setdefault(rec["score"], []).append((rec["realized_percent"], rec[metric]))
        return {k: sorted(out[k]) for k in self.score_keys}

    @property
    def is_complete(self) -> bool:
        return all(run_id in self.records for run_id, _, _ in self.config.run_ids())

    def head_scores(self):
        from .recording import HeadScores

        return HeadScores.load(self.path / "scores.pt")

    def table(self, tolerance: int | float = 1.0):
        """One row per score: max % zeroed within ``tolerance`` points, normalized AUC, rank."""
        import pandas as pd

        from .analysis import max_fraction_within, normalized_auc

        base = self.baseline_percent
        rows = []
        for key, points in self.curves().items():
            rows.append(
                {
                    "score": key,
                    "label": get_score(key).label,
                    "max_pct_within": max_fraction_within(points, base, tolerance),
                    "normalized_auc": normalized_auc(points),
                    "max_realized_pct": max(p for p, _ in points),
                    "points": len(points),
                }
            )
        frame = pd.DataFrame(rows)
        if not frame.empty:
            frame = frame.sort_values("normalized_auc", ascending=False, kind="stable")
            frame["rank"] = range(1, len(frame) + 1)
            frame = frame.reset_index(drop=True)
        return frame


def sweep_results(path: str | os.PathLike) -> SweepResults:
    """Read a results folder written by :func:`run_sweep` (or ``inactive-heads sweep``)."""
    return SweepResults.load(path)


def describe(keys: Sequence[str]) -> str:
    return ", ".join(f"{k} ({get_score(k).label})" for k in keys)
