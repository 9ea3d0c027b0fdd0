"""Zeroing heads at ``hook_z``: static sets, the paper's in-pass dynamic thresholds, and Random.

``hook_z`` holds each head's output ``o_t`` before the output projection ``W_O``. Zeroing head
``h`` there removes exactly ``o_t W_O^(h)`` from the attention block's output, for every position
(the block's bias ``b_O`` stays). Zeroing slices *after* ``W_O`` would instead cut mixed residual
coordinates, which is not a head.

Dynamic ablation follows the paper: at every layer, the score of each head is computed for each
sequence from that layer's pattern/values/outputs **in the same forward pass** — so zeroing in
earlier layers changes the scores of later ones (the cascade) — and the heads that the score calls
inactive at τ are zeroed for that sequence only. Flags are counted, so the **realized** fraction of
(sequence, layer, head) zeroed can be reported overall and per layer.

Ablation *kinds* are registered (:func:`register_ablation`): ``static``, ``dynamic`` and ``random``
are the built-in ones, and a registered subclass of :class:`HeadAblation` is one too. A kind's
spec (``ablation.to_spec()``, an :class:`AblationSpec`'s ``to_dict()``) is what records store and
:func:`ablation_from_spec` rebuilds; :class:`AblationSpec` finds the class by looking its kind up.
"""

import json
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..core.checks import check_heads, head_indices, head_pairs
from ..core.errors import NonFiniteError, UnknownNameError, UserError
from ..models.loading import model_info
from ..runtime.hook_registry import installed
from ..runtime.hooks import HeadHookRunner, zero_heads
from ..scoring.scores import LayerActivations, get_score, layer_reads
from .stats import AblationStats


BUILT_IN_KINDS = ("static", "dynamic", "random")
_KINDS: dict[str, type["HeadAblation"]] = {}  # kind -> class, built-ins first
_KIND_OF: dict[type, str] = {}  # class -> kind
_RESERVED_KINDS = ("custom", "none")  # "custom": describe() of an unregistered class; "none": no ablation


@dataclass(frozen=True)
class AblationSpec:
    """A JSON-friendly description of an ablation; ``build()`` turns it into hooks.

    ``kind`` is a registered ablation kind (:func:`register_ablation`); the lookup finds its class.

    - ``static``: ``heads`` = list of (layer, head), zeroed on every sequence;
    - ``dynamic``: ``score`` key and ``threshold`` τ, decided per sequence and layer in-pass;
    - ``random``: each (sequence, layer, head) zeroed with probability ``threshold``, seeded;
    - a kind you registered: its keyword arguments in ``params`` (the class's :meth:`HeadAblation.params`).
    """

    kind: str
    score: str | None = None
    threshold: float | None = None
    heads: tuple = ()  # of (layer, head) pairs
    seed: int = 0
    params: dict[str, Any] | None = None  # a registered (non built-in) kind's keyword arguments

    def __post_init__(self):
        cls = ablation_kind(self.kind)  # one-line error listing the registered kinds
        if self.kind in BUILT_IN_KINDS:
            if self.params is not None:
                raise UserError(f"the built-in ablation kind {self.kind!r} takes score, threshold, heads and seed, "
                                f"not params; got params={self.params!r}")
            cls._check_fields(self)
            return
        if (self.score, self.threshold, self.heads, self.seed) != (None, None, (), 0):
            raise UserError(f"ablation kind {self.kind!r} takes its arguments in params=..., not in "
                            "score, threshold, heads or seed")
        object.__setattr__(self, "params", _json_params(self.kind, self.params or {}))

    @property
    def name(self) -> str:
        if self.kind in BUILT_IN_KINDS:
            return _KINDS[self.kind]._fields_name(self)
        if not self.params:
            return self.kind
        return f"{self.kind}(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in self.params.items()) + ")"

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "score", "threshold", "heads", "seed"}`` for a built-in kind (the format of
        every record so far), ``{"kind": kind, **params}`` for a registered one."""
        if self.kind not in BUILT_IN_KINDS:
            return {"kind": self.kind, **self.params}
        d = asdict(self)
        del d["params"]
        d["heads"] = [list(h) for h in self.heads]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AblationSpec":
        """Inverse of :meth:`to_dict` (the kind must be registered: import its module first)."""
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
            raise UserError(f"an ablation spec is a dict with a 'kind' (e.g. {{'kind': 'static', 'heads': [[3, 1]]}}), "
                            f"got {d!r}")
        d = dict(d)
        if d["kind"] not in BUILT_IN_KINDS:
            kind = d.pop("kind")
            return cls(kind, params=d)
        d["heads"] = tuple(tuple(h) for h in d.get("heads", ()))
        return cls(**d)

    def build(self) -> "HeadAblation":
        """The ablation this spec describes: the registered class of ``kind``, built from the spec."""
        return _KINDS[self.kind]._from_spec(self)


def _json_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as its JSON form (what a record stores and a worker reads back), or a one-line error."""
    if not isinstance(params, dict) or "kind" in params or not all(isinstance(k, str) for k in params):
        raise UserError(f"the params of ablation kind {kind!r} must be a dict with string keys other than 'kind', "
                        f"got {params!r}")
    try:
        return json.loads(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise UserError(f"the params of ablation kind {kind!r} must be JSON values (numbers, strings, lists, "
                        f"dicts), got {params!r}: {err}") from None


def register_ablation(kind: str, *, overwrite: bool = False):
    """Class decorator: make a :class:`HeadAblation` subclass the ablation kind ``kind``.

    A registered kind has a spec (``ablation.to_spec()``: ``{"kind": kind, **ablation.params()}``),
    which records store and :func:`ablation_from_spec` rebuilds (the lm-eval model reads it from
    its ``ablation`` argument). The module that registers the kind must be imported before a spec
    naming it is read.

    >>> @register_ablation("layer_zero_heads")
    ... class LayerZeroHeads(HeadAblation):
    ...     def decide(self, acts):
    ...         return torch.full((acts.z.shape[0], acts.n_heads), acts.layer == 0, device=acts.z.device)
    >>> LayerZeroHeads().to_spec(), type(ablation_from_spec({"kind": "layer_zero_heads"})).__name__
    ({'kind': 'layer_zero_heads'}, 'LayerZeroHeads')
    >>> unregister_ablation("layer_zero_heads")
    """
    if not isinstance(kind, str) or not kind.isidentifier():
        raise UserError(f"ablation kind {kind!r} must be a Python identifier such as 'my_ablation'")
    if kind in _RESERVED_KINDS:
        raise UserError(f"ablation kind {kind!r} is reserved; choose another name")

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, HeadAblation)):
            raise UserError(f"register_ablation({kind!r}) decorates a HeadAblation subclass, got {cls!r}")
        if kind in BUILT_IN_KINDS and kind in _KINDS:
            raise UserError(f"{kind!r} is a built-in ablation kind and cannot be replaced; choose another name")
        if kind in _KINDS and _KINDS[kind] is not cls and not overwrite:
            raise UserError(f"ablation kind {kind!r} is already registered ({_class_path(_KINDS[kind])}); "
                            "pass overwrite=True to replace it")
        if _KIND_OF.get(cls, kind) != kind:
            raise UserError(f"{cls.__name__} is already registered as ablation kind {_KIND_OF[cls]!r}")
        if kind in _KINDS:
            del _KIND_OF[_KINDS[kind]]
        _KINDS[kind] = cls
        _KIND_OF[cls] = kind
        return cls

    return decorate


def unregister_ablation(kind: str) -> None:
    """Remove a registered ablation kind (the built-in kinds stay)."""
    cls = ablation_kind(kind)
    if kind in BUILT_IN_KINDS:
        raise UserError(f"{kind!r} is a built-in ablation kind and cannot be removed")
    del _KINDS[kind], _KIND_OF[cls]


def ablation_kind(kind: str) -> type["HeadAblation"]:
    """The class registered as ``kind``, or a one-line error listing the registered kinds."""
    try:
        return _KINDS[kind]
    except (KeyError, TypeError):
        pass
    if kind == "custom":
        raise UserError("ablation kind 'custom' is the record of an unregistered HeadAblation subclass and cannot "
                        "be rebuilt; register the class with @ih.register_ablation('name') and record it again")
    raise UnknownNameError(
        f"unknown ablation kind {kind!r}; registered: {', '.join(_KINDS)} (register a HeadAblation subclass with "
        "@ih.register_ablation('name') and import its module first; lm-eval model arg imports=MODULE)"
    )


def ablation_kinds() -> list[str]:
    """The registered ablation kinds, built-in first (``static``, ``dynamic``, ``random``)."""
    return list(_KINDS)


def ablation_from_spec(spec: "dict[str, Any] | AblationSpec") -> "HeadAblation":
    """The ablation a spec describes (``ablation.to_spec()``, a record's ``"ablation"``), rebuilt:
    ``from_spec(a.to_spec())`` zeroes what ``a`` zeroes. The kind must be registered.

    >>> ablation_from_spec({"kind": "dynamic", "score": "ahon_ln", "threshold": 0.5}).name
    'ahon_ln:0.5'
    """
    if not isinstance(spec, AblationSpec):
        spec = AblationSpec.from_dict(spec)
    return spec.build()


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")


class HeadAblation:
    """Base class: hooks that zero heads at ``hook_z`` and count what they zeroed.

    Use ``with ablation.apply(model): model(tokens)`` for one unpadded batch, or pass it to
    :func:`inactive_heads.evaluate`, which handles padding. Subclasses implement :meth:`decide`.
    """

    reads: tuple[str, ...] = ("z",)
    seed: int = 0
    # Whether sequences that share a prefix get the same decisions on it (prefix reuse needs this).
    shares_prefix: bool = True
    # Class-level defaults, so a subclass whose __init__ skips super().__init__() still works.
    _stats: "AblationStats | None" = None
    _offset: int | None = None
    _nonfinite: list | None = None

    def __init__(self):
        self._stats: AblationStats | None = None
        self._nonfinite: list[Tensor] | None = None  # set by flags_for while decide() runs
        # Inside apply(): rows are numbered per forward pass, so each pass is shifted past the
        # sequences already seen (its own Random draws, its own entries in stats.masks).
        self._offset: int | None = None

    def __repr__(self) -> str:
        try:
            return f"<{type(self).__name__} {self.name}>"
        except Exception:  # e.g. params() of a half-built instance: the class is enough
            return f"<{type(self).__name__}>"

    @property
    def stats(self) -> AblationStats | None:
        """What was zeroed so far (pending flags are brought to the host first)."""
        if self._stats is not None:
            self._stats.flush()
        return self._stats

    @stats.setter
    def stats(self, value: AblationStats | None) -> None:
        self._stats = value

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        """Which heads of which rows to zero at this layer: the one method a subclass implements.

        Every run calls it, once per layer and batch, inside the forward pass (``evaluate``,
        ``record_scores`` under :meth:`apply`, ``lm_eval_model``, prefix reuse): overriding it on a
        built-in ablation changes what that ablation zeroes. Return a bool ``[batch, head]`` tensor
        on the activations' device; avoid ``.item()``/``bool()`` on tensors here (each is a
        device→host wait per layer) — :meth:`check_finite` defers that check to once per batch.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement decide(acts) -> bool [batch, head] tensor"
        )

    def check_finite(self, values: Tensor, what: str, layer: int) -> None:
        """For :meth:`decide`: make non-finite ``values`` an error. Inside a forward pass the check
        is deferred to the batch's one device→host copy (no wait per layer); outside, it runs now."""
        bad = ~torch.isfinite(values).all()
        if self._nonfinite is not None:
            self._nonfinite.append((bad, what))
        elif bool(bad):
            raise NonFiniteError(f"score '{what}' is not finite at layer {layer}; try dtype=torch.float32")

    def params(self) -> dict[str, Any]:
        """The keyword arguments of ``__init__`` that rebuild this ablation (JSON values): what a
        registered kind's spec holds besides ``"kind"``. The default, ``{}``, fits a class whose
        ``__init__`` takes none; override it otherwise (the built-ins return theirs, so a registered
        subclass of one with the same ``__init__`` needs nothing more)."""
        return {}

    @classmethod
    def _from_spec(cls, spec: AblationSpec) -> "HeadAblation":
        """This registered class built from ``spec`` (a registered kind's: ``cls(**spec.params)``)."""
        try:
            return cls(**spec.params)
        except TypeError as err:
            raise UserError(f"cannot build ablation kind {spec.kind!r} ({cls.__name__}) from params {spec.params!r}: "
                            f"{err}; its params() must return the keyword arguments of __init__") from None

    def _spec_as(self, base: type) -> AblationSpec:
        """This ablation's spec under the kind of the registered class ``base`` (its own or an ancestor)."""
        kind = _KIND_OF[base]
        if kind in BUILT_IN_KINDS:
            return base._own_spec(self)
        params = self.params()
        if not isinstance(params, dict):
            raise UserError(f"{type(self).__name__}.params() returned {type(params).__name__}; return a dict of "
                            "the keyword arguments of __init__")
        return AblationSpec(kind, params=params)

    @property
    def spec(self) -> AblationSpec | None:
        """The :class:`AblationSpec` that rebuilds this ablation, or None when there is none: an
        unregistered subclass that overrides :meth:`decide` (of a built-in too). An unregistered
        subclass that keeps its registered base's ``decide`` has the base's spec."""
        base = _registered_base(type(self))
        if base is None or (base is not type(self) and type(self).decide is not base.decide):
            return None
        return self._spec_as(base)

    def to_spec(self) -> dict[str, Any]:
        """The JSON spec that :func:`ablation_from_spec` rebuilds this ablation from (what records
        store): ``{"kind": ..., ...}``. An unregistered class has none: a one-line error says how to
        register it."""
        spec = self.spec
        if spec is None:
            raise UserError(
                f"{type(self).__name__} is not a registered ablation kind, so it has no spec to rebuild it from; "
                f"decorate the class with @ih.register_ablation('name') (and import its module where the spec is read)"
            )
        return spec.to_dict()

    @property
    def name(self) -> str:
        """Short name for progress bars and records: the spec's (``ahon_ln:0.5``), else the class's
        (``KeepLayer0``, or ``KeepLayer0(ahon_ln:0.5)`` for a subclass of a registered kind)."""
        spec = self.spec
        if spec is not None:
            return spec.name
        base = _registered_base(type(self))
        return type(self).__name__ + (f"({self._spec_as(base).name})" if base is not None else "")

    def describe(self) -> dict[str, Any]:
        """JSON-friendly record of this ablation: ``spec.to_dict()`` (:meth:`to_spec`), or for an
        unregistered custom ablation its class, :attr:`name` and the spec of the registered kind it
        extends (if any)."""
        spec = self.spec
        if spec is not None:
            return spec.to_dict()
        base = _registered_base(type(self))
        return {"kind": "custom", "name": self.name, "class": _class_path(type(self)),
                "base": self._spec_as(base).to_dict() if base is not None else None}

    def reset(self, model) -> None:
        info = model_info(model)
        self._stats = AblationStats(info.n_layers, info.n_heads)

    def flags_for(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        """This layer's decision for each sequence of the batch, counted in :attr:`stats`."""
        if self._offset is not None:
            if acts.layer == 0:  # a new forward pass starts
                self._offset = self._stats.n_sequences
            acts.sequence_ids = acts.sequence_ids + self._offset
        self._nonfinite = []  # check_finite() calls from decide() land here, checked at the flush
        try:
            flags = self.decide(acts)
            bad = self._nonfinite
        finally:
            self._nonfinite = None
        flags = _checked_flags(self, flags, acts)
        nonfinite, what = None, type(self).__name__
        if bad:
            what = bad[0][1]
            nonfinite = bad[0][0] if len(bad) == 1 else torch.stack([b for b, _ in bad]).any()
        stats = self._stats
        if acts.layer == 0:
            stats.flush()  # the previous batch's flags: one device→host copy per batch
        stats.add(acts.layer, acts.sequence_ids, flags, nonfinite, what, batch=acts.batch)
        return flags

    def on_layer(self, acts: LayerActivations) -> Float[Tensor, "batch pos head d_head"]:
        flags = self.flags_for(acts)
        return zero_heads(acts.z, flags)

    def runner(self, model) -> HeadHookRunner:
        if self._stats is None:
            self.reset(model)
        return HeadHookRunner(model, self.on_layer, reads=self.reads, seed=self.seed)

    @contextmanager
    def apply(self, model, *, valid: Bool[Tensor, "batch pos"] | None = None):
        """Install the hooks for forward passes in the block (all positions real unless ``valid``).

        Every forward pass in the block counts as new sequences: the rows of the second pass are
        numbered after those of the first (their own Random draws and their own ``stats.masks``).
        """
        runner = self.runner(model)
        if valid is not None:
            runner.set_batch(valid, torch.arange(valid.shape[0]))
        self._offset = self.stats.n_sequences
        try:
            with installed(model, runner.fwd_hooks()):
                yield runner
        finally:
            self._offset = None


@register_ablation("static")
class StaticAblation(HeadAblation):
    """Zero a fixed set of (layer, head) on every sequence, at all positions."""

    def __init__(self, heads: Iterable[tuple[int, int]]):
        super().__init__()
        self.heads = head_pairs(heads)
        self._by_layer: dict[int, list[int]] = {}
        for l, h in self.heads:
            self._by_layer.setdefault(l, []).append(h)

    def _own_spec(self) -> AblationSpec:
        return AblationSpec("static", heads=self.heads)

    def params(self) -> dict[str, Any]:
        return {"heads": [list(h) for h in self.heads]}

    @staticmethod
    def _check_fields(spec: AblationSpec) -> None:
        head_pairs(spec.heads)  # the one head-index rule; the spec keeps the order it was given
        object.__setattr__(spec, "heads", tuple((int(l), int(h)) for l, h in spec.heads))

    @staticmethod
    def _fields_name(spec: AblationSpec) -> str:
        return f"static:{len(spec.heads)}heads"

    @classmethod
    def _from_spec(cls, spec: AblationSpec) -> HeadAblation:
        return StaticAblation(spec.heads) if spec.kind == "static" else super()._from_spec(spec)

    def reset(self, model) -> None:
        info = model_info(model)
        check_heads(self.heads, info.n_layers, info.n_heads)
        super().reset(model)

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        flags = torch.zeros((acts.z.shape[0], acts.n_heads), dtype=torch.bool, device=acts.z.device)
        flags[:, self._by_layer.get(acts.layer, [])] = True
        return flags


@register_ablation("dynamic")
class DynamicAblation(HeadAblation):
    """The paper's intervention: zero heads whose in-pass score is beyond τ, per sequence and layer."""

    def __init__(self, score: str, threshold: float, *, seed: int = 0):
        super().__init__()
        self.score = get_score(score)
        if not _finite(threshold):
            raise UserError(f"threshold must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)
        self.seed = seed
        self.reads = layer_reads([self.score])

    def _own_spec(self) -> AblationSpec:
        return AblationSpec("dynamic", score=self.score.key, threshold=self.threshold, seed=self.seed)

    def params(self) -> dict[str, Any]:
        return {"score": self.score.key, "threshold": self.threshold, "seed": self.seed}

    @staticmethod
    def _check_fields(spec: AblationSpec) -> None:
        get_score(spec.score)  # raises with the list of known scores
        if spec.threshold is None or not _finite(spec.threshold):
            raise UserError(f"dynamic ablation needs a finite threshold, got {spec.threshold!r}")

    @staticmethod
    def _fields_name(spec: AblationSpec) -> str:
        return f"{spec.score}:{spec.threshold:.6g}"

    @classmethod
    def _from_spec(cls, spec: AblationSpec) -> HeadAblation:
        if spec.kind != "dynamic":
            return super()._from_spec(spec)
        return DynamicAblation(spec.score, spec.threshold, seed=spec.seed)

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        """The heads whose in-pass score on each row is beyond τ (a non-finite score is an error)."""
        values = self.score(acts)
        self.check_finite(values, self.score.key, acts.layer)
        return self.score.is_inactive(values, self.threshold)


@register_ablation("random")
class RandomAblation(DynamicAblation):
    """Zero each (sequence, layer, head) with probability ``p`` (the paper's Random baseline)."""

    shares_prefix = False  # independent draws per sequence: a shared prefix decides differently

    def __init__(self, p: float, *, seed: int = 0):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 <= p <= 1.0):
            raise UserError(f"p must be a probability in [0, 1], got {p!r}")
        super().__init__("random", p, seed=seed)

    def _own_spec(self) -> AblationSpec:
        return AblationSpec("random", threshold=self.threshold, seed=self.seed)

    def params(self) -> dict[str, Any]:
        return {"p": self.threshold, "seed": self.seed}

    @staticmethod
    def _check_fields(spec: AblationSpec) -> None:
        if not (spec.threshold is not None and 0.0 <= spec.threshold <= 1.0):
            raise UserError(f"random ablation needs a probability threshold in [0, 1], got {spec.threshold!r}")

    @staticmethod
    def _fields_name(spec: AblationSpec) -> str:
        return f"random:{spec.threshold:g}"

    @classmethod
    def _from_spec(cls, spec: AblationSpec) -> HeadAblation:
        if spec.kind != "random":
            return super()._from_spec(spec)
        return RandomAblation(spec.threshold, seed=spec.seed)


def _registered_base(cls: type) -> type | None:
    """The nearest registered class in ``cls``'s ancestry (``cls`` itself when registered)."""
    return next((base for base in cls.__mro__ if base in _KIND_OF), None)


def _checked_flags(ablation: HeadAblation, flags, acts: LayerActivations) -> Tensor:
    """``decide``'s answer as a bool ``[batch, head]`` tensor on the activations' device, or a
    one-line error naming the class (shape and dtype are host facts: no device wait)."""
    expected = (acts.z.shape[0], acts.n_heads)
    if not isinstance(flags, Tensor) or flags.dtype != torch.bool or tuple(flags.shape) != expected:
        got = f"{flags.dtype} tensor of shape {tuple(flags.shape)}" if isinstance(flags, Tensor) else type(flags).__name__
        raise UserError(
            f"{type(ablation).__name__}.decide returned a {got}; return a bool tensor of shape "
            f"[batch, head] = {list(expected)}"
        )
    return flags.to(acts.z.device)



def zero_heads_hook(heads: Iterable[int]):
    """A plain ``hook_z`` hook that zeros the given heads of one layer, for ``model.hooks``.

    >>> hook = zero_heads_hook([0, 4])
    >>> z = torch.ones(1, 3, 9, 2)
    >>> hook(z, None)[0, :, [0, 4]].abs().sum().item(), hook(z, None)[0, :, 1].sum().item()
    (0.0, 6.0)
    """
    heads = head_indices(heads)

    def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
        bad = [h for h in heads if h >= z.shape[2]]
        if bad:
            raise UserError(f"head {bad[0]} does not exist; this layer has heads 0..{z.shape[2] - 1}")
        z = z.clone()
        z[:, :, heads] = 0.0
        return z

    return hook
