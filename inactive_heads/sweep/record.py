"""A sweep's run record (:class:`RunRecord`, ``runs/<id>.json``) and what the folder says about
its scores (:class:`ScoreInfo`, in ``sweep.json``): typed, and read and written only here.

The JSON of a record keeps the key names, order and value encodings that records had before this
class existed, so a record read and written again is the same text. Every record has the common
keys; a generation run's record (``decision`` set) also the generation keys; a static run's the
``static_*`` keys; ``oracle_savings`` and ``reused_from`` only where they apply.

The results folder format (:data:`RESULTS_FORMAT`): 1, folders written before a version was kept
(no ``"format_version"``); 2, ``"format_version"`` in ``sweep.json`` and in every record; 3,
``sweep.json`` also describes the sweep's scores (``"score_info"``: label, direction and what
each reads), so a folder renders without the modules that registered them. A record is the same
in 2 and 3.
"""

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..analysis.tables import BASELINE
from ..core.errors import UserError

RESULTS_FORMAT = 3

VOLATILE_FIELDS = ("seconds", "finished_at")
"""Record fields that differ between two computations of the same run."""


def check_format(version: Any, where: Path) -> None:
    """A one-line error for a results file of a format this version cannot read."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UserError(f"'{where}' has format_version {version!r}; expected a positive integer")
    if version > RESULTS_FORMAT:
        raise UserError(f"'{where}' is in results format {version}; this inactive-heads reads formats up to "
                        f"{RESULTS_FORMAT}: upgrade inactive-heads to read it")


# Keys only a generation run's record has (GSM8K); a multiple-choice record has none of them.
_GENERATION = frozenset({
    "accuracy_flexible", "realized_fraction_prompts", "decision", "use_cache", "n_generated_tokens",
    "correct_flexible", "generations", "answers", "savings",
})
_STATIC = frozenset({"static_rule", "static_calibration", "static_heads", "static_n_sequences"})
_WHEN_SET = frozenset({"oracle_savings", "reused_from"})


@dataclass(frozen=True)
class RunRecord:
    """One finished run of a sweep: what ran, its accuracy and realized zeroing, and every
    question's outcome. The fields are in the order the JSON has them."""

    format_version: int
    run_id: str
    model: str | None
    task: str | None
    score: str | None
    label: str | None
    p: float | None
    threshold: float | None
    accuracy: float | None
    accuracy_percent: float | None
    acc_norm: float | None = None
    accuracy_flexible: float | None = None
    realized_fraction: float | None = None
    realized_percent: float | None = None
    realized_fraction_per_layer: list[float] | None = None
    realized_fraction_prompts: float | None = None
    decision: str | None = None
    use_cache: bool | None = None
    n: int | None = None
    n_forward_sequences: int | None = None
    n_generated_tokens: int | None = None
    correct: list[bool] | None = None
    correct_norm: list[bool | None] | None = None
    correct_flexible: list[bool] | None = None
    loglikelihoods: list[list[float]] | None = None
    gold: list[Any] | None = None
    generations: list[str] | None = None
    answers: list[dict[str, str]] | None = None
    doc_ids: list[Any] | None = None
    subjects: list[str | None] | None = None
    per_subject: dict[str, Any] | None = None
    savings: dict[str, Any] | None = None
    dtype: str | None = None
    device: str | None = None
    backend: str | None = None
    batch_size: int | None = None
    torch_threads: int | None = None
    seconds: float | None = None
    ablation: dict[str, Any] | None = None
    static_rule: str | None = None
    static_calibration: list[int] | None = None
    static_heads: list[list[int]] | None = None
    static_n_sequences: int | None = None
    oracle_savings: dict[str, Any] | None = None
    finished_at: str | None = None
    reused_from: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Keys of the JSON this version does not know (kept, and written back last)."""

    @property
    def is_generation(self) -> bool:
        """A generation run's record (GSM8K): generations and answers instead of log-likelihoods."""
        return self.decision is not None

    @property
    def curve_key(self) -> str | None:
        """The score curve this run is a point of; None for the baseline and for one of a
        sweep's fixed ablations (no p)."""
        return self.score if self.score and self.p is not None else None

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object ``runs/<id>.json`` holds."""
        out: dict[str, Any] = {}
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if name == "extra" or (name in _GENERATION and not self.is_generation) \
                    or (name in _STATIC and self.static_rule is None) or (name in _WHEN_SET and value is None):
                continue
            out[name] = value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: Path | str = "a run record") -> "RunRecord":
        """A record read back from its JSON object, after checking that this version reads its
        format (none: format 1). Keys the record lacks (older records) read as None."""
        if not isinstance(d, Mapping) or "score" not in d or "p" not in d:
            raise UserError(f"'{where}' is not a run record of inactive-heads (no score and p); the folder is "
                            "damaged or another tool's: rerun the sweep into a new folder")
        version = d.get("format_version", 1)
        check_format(version, Path(where))
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in d.items() if k in known}
        values.update(format_version=version, run_id=d.get("run_id"))
        for name in ("model", "task", "label", "threshold", "accuracy", "accuracy_percent"):
            values.setdefault(name, None)
        return cls(**values, extra={k: v for k, v in d.items() if k not in known})

    def reused(self, run_id: str, score: str, label: str, p: float, threshold: float,
               ablation: dict[str, Any]) -> "RunRecord":
        """The record of a run that zeroes nothing by construction: this (the baseline's) outcomes
        under the run's own id, score, p, τ and ablation, marked ``reused_from``."""
        return replace(self, format_version=RESULTS_FORMAT, run_id=run_id, score=score, label=label, p=p,
                       threshold=threshold, ablation=ablation, seconds=0.0, reused_from=BASELINE,
                       finished_at=now())

    def without_volatile(self) -> dict[str, Any]:
        """The JSON without the fields that differ between two computations of the same run."""
        return {k: v for k, v in self.to_json().items() if k not in VOLATILE_FIELDS}


def now() -> str:
    """The time a record says it finished at (local time, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class ScoreInfo:
    """What a results folder says about one of its scores: its label, direction ("below": a head
    is inactive when its score is below τ; "above") and what it reads. ``sweep.json`` keeps one
    per score of the sweep, so a report renders without the module that registered it."""

    label: str
    direction: str
    reads: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reads": list(self.reads)}

    @classmethod
    def from_json(cls, d: Any, where: Path | str) -> "ScoreInfo":
        if (not isinstance(d, Mapping) or not isinstance(d.get("label"), str)
                or d.get("direction") not in ("below", "above") or not isinstance(d.get("reads", []), list)):
            raise UserError(f"'{where}' has a malformed score_info entry {d!r} (label, direction 'below' or "
                            "'above', reads); the folder is damaged: rerun the sweep into a new folder")
        return cls(d["label"], d["direction"], tuple(d.get("reads", [])))

    @classmethod
    def registered(cls, key: str) -> "ScoreInfo":
        """The info of a registered score (the write side: the sweep's modules are imported)."""
        from ..scoring.scores import get_score

        score = get_score(key)
        return cls(score.label, score.direction, tuple(score.reads))
