"""The score functions of the paper's taxonomy, and the registry that new ones join.

A score function maps one layer's attention quantities for a batch (a :class:`LayerActivations`)
to one number per (sequence, head). Each carries its paper label, what it reads and its direction:
a head is *inactive* on a sequence when its score is below τ (``direction="below"``) or above τ
(``"above"``, the two first-token-weight scores).

Formulas follow Sandoval-Segura et al., *Identifying and Evaluating Inactive Heads in Pretrained
LLMs* (ICLR 2026), as digested in ``docs/concepts.md``. One deliberate difference from the
authors' code: pad positions are excluded as keys **and** as queries in every average, so a
sequence's score never depends on what else is in its batch (the official AWFT/AEQD averaged over
right-pad query rows too).

Every score is reduced in float32 whatever the model's dtype: activations are cast to float32
before norms, entropies and means (in bounded chunks, so a bf16 model's attention pattern is never
copied whole), and sequence lengths are counted in float32, so a length of 1001 stays 1001 (bf16
would round it to 1000). A float32 model's numbers go through exactly the same operations as
before this rule existed.

Layer normalization ("LN") divides by the plain mean of the score over the layer's query heads
for the same sequence. Where that mean is 0 (every head of the layer scores exactly 0), the LN
score is defined as 0, so a layer of silent heads is flagged by every "below" score and never by
the "above" ones, and no NaN can appear.
"""

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from ..runtime.activations import READABLE, LayerActivations, at_least_float32, output_gram_factor  # noqa: F401
from ..core.errors import UnknownNameError, UserError, WrongTypeError

Direction = Literal["below", "above"]
ScoreFn = Callable[["LayerActivations"], Float[Tensor, "batch head"]]


# Low-precision inputs are cast to float32 in chunks of about this many elements, so the float32
# copy of a large attention pattern never exists whole.
_CHUNK_ELEMENTS = 1 << 24


def row_entropy(pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "batch head query"]:
    """−Σ_s A[t,s] ln A[t,s] per query row, computed in float32."""
    if pattern.dtype in (torch.float32, torch.float64):
        return torch.special.entr(pattern).sum(dim=-1)
    b, h, q, k = pattern.shape
    step = max(1, _CHUNK_ELEMENTS // max(1, b * h * k))
    out = torch.empty((b, h, q), dtype=torch.float32, device=pattern.device)
    for start in range(0, q, step):
        out[:, :, start : start + step] = torch.special.entr(pattern[:, :, start : start + step].float()).sum(dim=-1)
    return out


@dataclass(frozen=True)
class ScoreFunction:
    """A registered score: ``fn(acts) -> [batch, head]`` plus what it means."""

    key: str
    label: str
    fn: ScoreFn
    reads: tuple[str, ...]
    direction: Direction
    description: str = ""
    builtin: bool = False

    def __call__(self, acts: LayerActivations) -> Tensor:
        # Not shape-annotated: recording checks the shape itself and names the score.
        if self.builtin:
            return self.fn(acts)
        try:  # a registered function that fails is the user's code failing: one line naming it
            out = self.fn(acts)
        except UserError:
            raise
        except Exception as err:
            message = " ".join(str(err).split())
            raise UserError(f"score '{self.key}' (registered with register_score) raised {type(err).__name__} at "
                            f"layer {acts.layer}: {message}; fix the function") from err
        if not isinstance(out, Tensor):
            raise UserError(f"score '{self.key}' returned {type(out).__name__}; it must return a [batch, head] tensor")
        return out

    def is_inactive(self, scores: Tensor, threshold: float) -> Tensor:
        """Boolean mask of heads this score calls inactive at threshold τ."""
        if isinstance(threshold, bool) or not isinstance(threshold, Real) or not math.isfinite(threshold):
            raise UserError(f"threshold must be a finite number, got {threshold!r}")
        return flag_inactive(scores, threshold, self.direction)


def flag_inactive(scores: Tensor, threshold: float, direction: Direction) -> Tensor:
    """The one "inactive" comparison, strict: ``score > τ`` for an "above" score, ``score < τ``
    for a "below" one (ablation, calibration and analysis all flag through it).

    >>> flag_inactive(torch.tensor([0.1, 0.5, 0.9]), 0.5, "below").tolist()
    [True, False, False]
    """
    return scores > threshold if direction == "above" else scores < threshold


_REGISTRY: dict[str, ScoreFunction] = {}


def register_score(
    key: str,
    *,
    reads: tuple[str, ...] | list[str],
    direction: str,
    label: str | None = None,
    description: str = "",
    overwrite: bool = False,
    _builtin: bool = False,
):
    """Decorator that adds a score function to the registry used by recording and ablation.

    >>> @register_score("max_key_weight", reads=("pattern",), direction="above")
    ... def max_key_weight(acts):
    ...     return acts.mean_over_queries(acts.pattern.amax(dim=-1))
    >>> get_score("max_key_weight").direction
    'above'
    >>> unregister_score("max_key_weight")
    """
    if not isinstance(key, str) or not key.isidentifier():
        raise UserError(f"score key {key!r} must be a Python identifier such as 'my_score'")
    if direction not in ("below", "above"):
        raise UserError(f"direction {direction!r} must be 'below' or 'above'")
    if isinstance(reads, str) or not isinstance(reads, (tuple, list)):
        raise WrongTypeError(f"reads must be a tuple of names from {READABLE}, got {type(reads).__name__}")
    bad = [r for r in reads if r not in READABLE]
    if bad or not reads and key != "random":
        raise UserError(f"reads={tuple(reads)!r} must name some of {READABLE}")
    if key in _REGISTRY and not overwrite:
        raise UserError(f"score '{key}' is already registered; pass overwrite=True to replace it")

    def decorate(fn: ScoreFn) -> ScoreFn:
        _REGISTRY[key] = ScoreFunction(
            key=key,
            label=label or key,
            fn=fn,
            reads=tuple(reads),
            direction=direction,
            description=description or (fn.__doc__ or "").strip().split("\n")[0],
            builtin=_builtin,
        )
        return fn

    return decorate


def unregister_score(key: str) -> None:
    """Remove a user-registered score (built-in scores stay)."""
    score = get_score(key)
    if score.builtin:
        raise UserError(f"'{key}' is a built-in score and cannot be removed")
    del _REGISTRY[key]


def get_score(key: str) -> ScoreFunction:
    try:
        return _REGISTRY[key]
    except (KeyError, TypeError):  # TypeError: an unhashable key (a list, a dict)
        raise UnknownNameError(f"unknown score '{key}'; known: {', '.join(_REGISTRY)}") from None


def is_registered(key: str) -> bool:
    """Whether a score of this key is registered in this process."""
    try:
        get_score(key)
    except KeyError:
        return False
    return True


def score_keys(*, include_appendix: bool = True, include_random: bool = True) -> list[str]:
    """Registered score keys in registry order (the paper's 13 first)."""
    keys = list(_REGISTRY)
    if not include_appendix:
        keys = [k for k in keys if k not in APPENDIX_SCORES]
    if not include_random:
        keys = [k for k in keys if k != "random"]
    return keys


def resolve_scores(scores: str | list[str] | tuple[str, ...] | None) -> list[ScoreFunction]:
    """Turn None (all registered), one key, or a list of keys into score functions."""
    if scores is None:
        return list(_REGISTRY.values())
    if isinstance(scores, str):
        scores = [scores]
    if not isinstance(scores, (list, tuple)):
        raise WrongTypeError(f"scores must be None, a score key or a list of keys, got {type(scores).__name__}")
    if not scores:
        raise UserError("scores is empty; pass None for all scores or a list of keys")
    return [get_score(k) for k in scores]


def layer_reads(functions) -> tuple[str, ...]:
    """What the hooks capture for these score functions: what they declare, and ``z`` always
    (the callbacks run at ``hook_z``).

    Only a declared ``pattern`` makes a layer compute its attention pattern: with fused attention
    (:mod:`inactive_heads.runtime.fast_attention`) an unread pattern is never formed, so AHON, AVVN, FTVVN,
    LTHON and FHO run without it. A score that reads something it did not declare gets a one-line
    error naming the missing ``reads=``. ``W_O`` is fetched only when declared (the bridge rebuilds
    it on every access).
    """
    wanted = {"z"}.union(*(f.reads for f in functions))
    return tuple(name for name in READABLE if name in wanted)


def layer_normalize(scores: Float[Tensor, "batch head"]) -> Float[Tensor, "batch head"]:
    """Divide by the mean over the layer's heads (same sequence); 0 where that mean is 0."""
    if not isinstance(scores, Tensor) or scores.ndim != 2:
        raise WrongTypeError(f"scores must be a [batch, head] tensor, got "
                             f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__}")
    mean = scores.mean(dim=-1, keepdim=True)
    safe = torch.where(mean == 0, torch.ones_like(mean), mean)
    return torch.where(mean == 0, torch.zeros_like(scores), scores / safe)


def safe_ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, with 0 where den is 0."""
    safe = torch.where(den == 0, torch.ones_like(den), den)
    return torch.where(den == 0, torch.zeros_like(num), num / safe)


# ----------------------------------------------------------------------------------------------
# The paper's score functions. Base scores first; each LN variant divides by the layer mean.


def first_token_weight(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """AWFT: mean over real query rows t of A[t, 0], the weight on the sequence's first token."""
    return acts.memo("awft", lambda: acts.mean_over_queries(acts._need("pattern")[..., 0]))


def query_entropy(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """AEQD: mean over real query rows of −Σ_s A[t,s] ln A[t,s] (natural log, not length-normalized)."""

    def compute():
        return acts.mean_over_queries(row_entropy(acts._need("pattern")))

    return acts.memo("aeqd", compute)


def first_value_norm(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """FTVVN: ‖v_0‖, the first token's value-vector norm (shared within a GQA group)."""
    return acts.v_norm[:, 0, :]


def avg_value_norm(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """AVVN: mean over real positions of ‖v_t‖."""
    return acts.memo("avvn", lambda: acts.mean_over_positions(acts.v_norm))


def last_output_norm(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """LTHON: ‖o_{T-1}‖, the head output norm at the last real position."""
    return acts.memo("lthon", lambda: acts.at_last_token(acts.z_norm))


def avg_output_norm(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """AHON: mean over real positions of ‖o_t‖ (head output before W_O)."""
    return acts.memo("ahon", lambda: acts.mean_over_positions(acts.z_norm))


def full_output_norm(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """Mean over real positions of ‖o_t W_O^(h)‖ (after the output projection; paper App. A.1)."""
    return acts.memo("fho", lambda: acts.mean_over_positions(acts.result_norm))


def _ln(base: ScoreFn) -> ScoreFn:
    def normalized(acts: LayerActivations) -> Float[Tensor, "batch head"]:
        return layer_normalize(base(acts))

    normalized.__doc__ = f"{(base.__doc__ or '').split(':')[0]} (LN): divided by the layer mean over heads."
    return normalized


def last_output_norm_ln(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """LTHON (LN): ‖o_{T-1}‖ divided by the layer mean of the heads' *average* output norms."""
    return safe_ratio(last_output_norm(acts), avg_output_norm(acts).mean(dim=-1, keepdim=True))


def last_output_norm_hn(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """LTHON (HN): ‖o_{T-1}‖ divided by the same head's average output norm."""
    return safe_ratio(last_output_norm(acts), avg_output_norm(acts))


# Random's draw for (seed, sequence id, layer) is seeded by ((seed * SEQ_SPAN + id) << 12) + layer
# for ids below SEQ_SPAN (every likelihood-task sequence, every prompt); that key is one-to-one
# there. An id of SEQ_SPAN or more (a generation step, GENERATION_STEP_SHIFT) would alias with the
# next seed's ids (seed s, id i + SEQ_SPAN = seed s + 1, id i), so its key is a 64-bit hash of
# (seed, id, layer) instead.
SEQ_SPAN = 1_000_003
GENERATION_STEP_SHIFT = 32  # generation id of (prompt p, step t) = p + (t << 32)


def random_key(seed: int, sequence_id: int, layer: int) -> int:
    """The generator seed of Random's draw for one (sequence, layer), as documented above.

    >>> random_key(1, 5, 3) == ((1 * 1_000_003 + 5) << 12) + 3
    True
    >>> random_key(0, 1_000_003 + 5, 3) == random_key(1, 5, 3)   # the aliasing the hash avoids
    False
    """
    if 0 <= sequence_id < SEQ_SPAN:
        return ((seed * SEQ_SPAN + sequence_id) << 12) + layer
    digest = hashlib.blake2b(f"random:{seed}:{sequence_id}:{layer}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def generation_id(prompt_id: int, step: int) -> int:
    """Random's sequence id for generation step ``step`` of prompt ``prompt_id`` (step 0, the
    prompt itself, is the prompt's own id): a function of the two only, whatever ``max_new_tokens``."""
    return prompt_id + (step << GENERATION_STEP_SHIFT)


def uniform_random(acts: LayerActivations) -> Float[Tensor, "batch head"]:
    """Random: u ~ U(0, 1) per (sequence, layer, head), seeded by :func:`random_key` of (seed,
    sequence id, layer)."""
    rows = []
    for seq in acts.sequence_ids.tolist():
        gen = torch.Generator().manual_seed(random_key(acts.seed, seq, acts.layer))
        rows.append(torch.rand(acts.n_heads, generator=gen))
    return torch.stack(rows).to(acts.valid.device)


_BUILTINS = [
    ("awft", "AWFT", first_token_weight, ("pattern",), "above"),
    ("awft_ln", "AWFT (LN)", _ln(first_token_weight), ("pattern",), "above"),
    ("aeqd", "AEQD", query_entropy, ("pattern",), "below"),
    ("aeqd_ln", "AEQD (LN)", _ln(query_entropy), ("pattern",), "below"),
    ("ftvvn", "FTVVN", first_value_norm, ("v",), "below"),
    ("ftvvn_ln", "FTVVN (LN)", _ln(first_value_norm), ("v",), "below"),
    ("avvn", "AVVN", avg_value_norm, ("v",), "below"),
    ("avvn_ln", "AVVN (LN)", _ln(avg_value_norm), ("v",), "below"),
    ("lthon", "LTHON", last_output_norm, ("z",), "below"),
    ("lthon_ln", "LTHON (LN)", last_output_norm_ln, ("z",), "below"),
    ("lthon_hn", "LTHON (HN)", last_output_norm_hn, ("z",), "below"),
    ("ahon", "AHON", avg_output_norm, ("z",), "below"),
    ("ahon_ln", "AHON (LN)", _ln(avg_output_norm), ("z",), "below"),
    ("random", "Random", uniform_random, (), "below"),
    ("fho", "Full head output norm", full_output_norm, ("z", "W_O"), "below"),
    ("fho_ln", "Full head output norm (LN)", _ln(full_output_norm), ("z", "W_O"), "below"),
]
for _key, _label, _fn, _reads, _direction in _BUILTINS:
    register_score(_key, label=_label, reads=_reads, direction=_direction, _builtin=True)(_fn)

PAPER_SCORES: tuple[str, ...] = tuple(k for k, *_ in _BUILTINS[:13])
"""The 13 functions of the paper's taxonomy, in its order."""
APPENDIX_SCORES: tuple[str, ...] = ("fho", "fho_ln")
OFFICIAL_NAMES: dict[str, str] = {
    "awft": "Dormant",
    "awft_ln": "NormalizedDormant",
    "aeqd": "Entropy",
    "aeqd_ln": "NormalizedEntropy",
    "ftvvn": "ValueVectorMagnitudeFirstToken",
    "ftvvn_ln": "ValueVectorMagnitudeNormalizedFirstToken",
    "avvn": "ValueVectorAvgMagnitude",
    "avvn_ln": "ValueVectorAvgNormalizedMagnitude",
    "lthon": "HeadOutputMagnitudeLastToken",
    "lthon_ln": "HeadOutputMagnitudeNormalizedLastToken",
    "lthon_hn": "HeadOutputMagnitudeNormalizedHeadLastToken",
    "ahon": "UnnormalizedHONOR",
    "ahon_ln": "HONOR",
    "random": "RandomHeads",
    "fho": "FullHeadOutput",
    "fho_ln": "FullHeadOutputNormalized",
}
"""Our keys → the class/internal names of the authors' code (used in their thresholds.json)."""


STATIC_SUFFIX = "@static"  # a sweep's static runs of score k form the curve "k@static"


def score_label(key: str) -> str:
    """The paper's label of score ``key`` ("AHON (LN)"), "AHON (LN), static" for a sweep's static
    curve of it (``"ahon_ln@static"``), or the key itself for an unregistered one."""
    if key.endswith(STATIC_SUFFIX):
        return f"{score_label(key[:-len(STATIC_SUFFIX)])}, static"
    try:
        return get_score(key).label
    except KeyError:
        return key
