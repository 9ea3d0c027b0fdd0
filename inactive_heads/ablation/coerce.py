"""What every entry point accepts as ``ablation=``, turned into one thing: :func:`as_ablation`.

``ih.evaluate``, ``ih.generate``, ``ih.evaluate_generation``, the lm-eval model type and sweeps
all take an ablation the same ways: ``None``, a :class:`HeadAblation` (kept itself: an
unregistered subclass runs too), an :class:`AblationSpec`, a spec dict (``{"kind": ..., ...}``:
``ablation.to_spec()``, a record's ``"ablation"``), or text (:func:`parse_ablation`). The text
form ``score@pP`` (τ calibrated on the run's own inputs) is a :class:`CalibratedAblation`, which
only the lm-eval model runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.errors import UnknownNameError, UserError
from ..scoring.scores import get_score
from .head_ablation import AblationSpec, HeadAblation, ablation_kind

TEXT_FORMS = "score@tau (ahon_ln@0.8), score@pP (ahon_ln@p0.1), random@P, static:LAYER.HEAD/LAYER.HEAD"


@dataclass(frozen=True)
class CalibratedAblation:
    """Dynamic ablation of ``score`` at the τ that flags a fraction ``p`` of the run's own scores.

    The threshold is calibrated, per request type, on the forward inputs lm-eval sends (recorded
    with nothing zeroed, pooled over sequences, layers and heads), then the run uses it.
    """

    score: str
    p: float
    seed: int = 0

    def __post_init__(self):
        get_score(self.score)  # raises with the list of known scores
        if not (isinstance(self.p, (int, float)) and 0.0 <= self.p <= 1.0):
            raise UserError(f"calibrated ablation needs a fraction p in [0, 1], got {self.p!r}")

    @property
    def name(self) -> str:
        return f"{self.score}@p{self.p:g}"


def parse_ablation(text: str | None, *, seed: int = 0) -> HeadAblation | CalibratedAblation | None:
    """``"score@tau"``, ``"score@pP"``, ``"random@P"``, ``"static:L.H/L.H"``, a registered kind's
    name (``"my_kind"``, no arguments), a JSON spec (``'{"kind": "my_kind", "k": 2}'``) or ``"none"``.
    ``seed`` is that of the ``score@...`` and ``random@P`` forms.

    >>> parse_ablation("ahon_ln@0.8").threshold
    0.8
    >>> parse_ablation("ahon_ln@p0.1")
    CalibratedAblation(score='ahon_ln', p=0.1, seed=0)
    >>> parse_ablation("static:3.1/5.2").heads
    ((3, 1), (5, 2))
    """
    if text is None:
        return None
    text = str(text).strip()
    if text.lower() in ("", "none"):
        return None
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError as err:
            raise UserError(f"cannot read the JSON spec in ablation {text!r}: {err}") from None
        return AblationSpec.from_dict(spec).build()
    if text.startswith("static:"):
        heads = []
        for item in text[len("static:"):].split("/"):
            layer, _, head = item.partition(".")
            if not (layer.strip().isdigit() and head.strip().isdigit()):
                raise UserError(
                    f"bad head {item!r} in ablation {text!r}; write static heads as static:LAYER.HEAD/LAYER.HEAD"
                )
            heads.append((int(layer), int(head)))
        return AblationSpec("static", heads=tuple(heads)).build()
    if text.isidentifier():  # a registered kind, built with no arguments
        try:
            ablation_kind(text)
        except UnknownNameError as err:
            raise UnknownNameError(f"{err}; as text also {TEXT_FORMS}") from None
        return AblationSpec.from_dict({"kind": text}).build()
    score, at, value = text.partition("@")
    if not at or not value:
        raise UserError(f"cannot read ablation {text!r}; use {TEXT_FORMS} or a registered kind's name")
    calibrated = value.startswith("p")
    try:
        number = float(value[1:] if calibrated else value)
    except ValueError:
        raise UserError(f"cannot read the number {value!r} in ablation {text!r}") from None
    if score == "random":
        return AblationSpec("random", threshold=number, seed=seed).build()
    if calibrated:
        return CalibratedAblation(score, number, seed=seed)
    return AblationSpec("dynamic", score=score, threshold=number, seed=seed).build()


AblationLike = HeadAblation | AblationSpec | CalibratedAblation | dict | str | None


def as_ablation(ablation, *, seed: int = 0,
                calibrated: bool = False) -> HeadAblation | CalibratedAblation | None:
    """Any ``ablation=`` value as a :class:`HeadAblation` (or None): an instance is kept itself, an
    :class:`AblationSpec` or spec dict is built through the registry, text is read by
    :func:`parse_ablation` (with ``seed``). ``calibrated=True`` (the lm-eval model) also lets a
    :class:`CalibratedAblation` through, for the caller to calibrate.

    >>> as_ablation({"kind": "random", "threshold": 0.1}).name, as_ablation("static:1.2").heads
    ('random:0.1', ((1, 2),))
    """
    if ablation is None or isinstance(ablation, HeadAblation):
        return ablation
    if isinstance(ablation, AblationSpec):
        return ablation.build()
    if isinstance(ablation, dict):
        return AblationSpec.from_dict(ablation).build()
    if isinstance(ablation, str):
        ablation = parse_ablation(ablation, seed=seed)
    if isinstance(ablation, CalibratedAblation):
        if not calibrated:
            raise UserError(
                f"ablation {ablation.name!r} calibrates τ on the run's own inputs, which only the lm-eval model does; "
                f"here calibrate first (ih.calibrate) and pass ih.DynamicAblation({ablation.score!r}, tau)"
            )
        return ablation
    if ablation is None or isinstance(ablation, HeadAblation):  # text: parsed above
        return ablation
    raise UserError(
        f"ablation must be None, a HeadAblation, an AblationSpec, a spec dict ({{'kind': ...}}) or text like "
        f"'ahon_ln@0.8', got {type(ablation).__name__}"
    )

