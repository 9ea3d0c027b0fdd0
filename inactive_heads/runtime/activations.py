"""What a layer's attention hooks hand to the score functions: :class:`LayerActivations`.

The runtime fills one per layer and batch from ``hook_pattern`` / ``hook_v`` / ``hook_z`` (and
``W_O`` when a score reads it); the score functions in :mod:`inactive_heads.scoring` reduce it to
one number per (sequence, head). Norms and means are taken in float32 whatever the model dtype.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
import weakref

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from ..core.errors import UserError

READABLE = ("pattern", "v", "z", "W_O")


@dataclass(eq=False)
class LayerActivations:
    """One layer's attention quantities for a right-padded batch, as the score functions see them.

    ``pattern``: softmax attention weights, query head first, ``[batch, head, query, key]``.
    ``v_grouped``: value vectors as the model computes them (``[batch, pos, kv_head, d_head]``;
    under GQA several query heads share one KV head). ``v`` is the per-query-head expansion.
    ``z``: head outputs before ``W_O`` ``[batch, pos, head, d_head]``.
    ``valid``: True at real (non-pad) positions. Right padding: row ``b`` is real on
    ``[0, lengths[b])``. ``sequence_ids``: each row's index in the whole run (seeds Random).
    The tensors are valid during the score call only (a prefix-reusing pass refills one pattern
    buffer layer after layer): a score reduces them and keeps none. ``batch``: a token the hook
    runner gives each forward pass (:func:`~inactive_heads.runtime.hooks.new_batch_token`); per-layer
    results with the same token are brought to the host together (None: a batch of its own).
    """

    layer: int
    n_heads: int
    valid: Bool[Tensor, "batch pos"]
    sequence_ids: Int[Tensor, " batch"]
    pattern: Float[Tensor, "batch head query key"] | None = None
    v_grouped: Float[Tensor, "batch pos kv_head d_head"] | None = None
    z: Float[Tensor, "batch pos head d_head"] | None = None
    W_O: Float[Tensor, "head d_head d_model"] | None = None
    seed: int = 0
    # The residual stream entering the layer (``hook_resid_pre``), when an ablation reads
    # ``"resid_pre"`` (:class:`~inactive_heads.runtime.hooks.HeadHookRunner`); no score reads it.
    resid_pre: Float[Tensor, "batch pos d_model"] | None = None
    batch: int | None = field(default=None, init=False)
    _memo: dict = field(default_factory=dict, repr=False)

    def _need(self, name: str) -> Tensor:
        value = getattr(self, name)
        if value is None:
            raise UserError(
                f"this score reads '{name}' but it was not captured; declare it in the score's "
                f"reads=(...) (one of {READABLE})"
            )
        return value

    @cached_property
    def lengths(self) -> Int[Tensor, " batch"]:
        return self.valid.sum(dim=1)

    @cached_property
    def last_index(self) -> Int[Tensor, " batch"]:
        return self.lengths - 1

    @cached_property
    def v(self) -> Float[Tensor, "batch pos head d_head"]:
        v = self._need("v_grouped")
        group = self.n_heads // v.shape[2]
        return v if group == 1 else v.repeat_interleave(group, dim=2)

    @cached_property
    def v_norm(self) -> Float[Tensor, "batch pos head"]:
        # Norms on the grouped values, then expanded: the same numbers, far less work.
        norms = at_least_float32(self._need("v_grouped")).norm(dim=-1)
        group = self.n_heads // norms.shape[2]
        return norms if group == 1 else norms.repeat_interleave(group, dim=2)

    @cached_property
    def z_norm(self) -> Float[Tensor, "batch pos head"]:
        return at_least_float32(self._need("z")).norm(dim=-1)

    @cached_property
    def result_norm(self) -> Float[Tensor, "batch pos head"]:
        """‖o_t W_O^(h)‖: the norm of each head's output after its slice of the output projection.

        Computed as ‖o R_hᵀ‖ with R_hᵀ R_h = W_O^(h) W_O^(h)ᵀ, the head's ``[d_head, d_head]`` Gram
        matrix (:func:`output_gram_factor`, cached per weight): no ``[batch, pos, head, d_model]``
        tensor is ever formed.
        """
        z = at_least_float32(self._need("z"))
        factor = output_gram_factor(self._need("W_O")).to(device=z.device, dtype=z.dtype)
        return torch.einsum("bphd,hed->bphe", z, factor).norm(dim=-1)

    def mean_over_positions(self, per_pos: Float[Tensor, "batch pos head"]) -> Float[Tensor, "batch head"]:
        """Mean over each sequence's real positions (pads excluded), in float32."""
        per_pos = at_least_float32(per_pos)
        mask = self.valid.to(per_pos.device).unsqueeze(-1).to(per_pos.dtype)
        return (per_pos * mask).sum(dim=1) / self.lengths.to(per_pos.device).unsqueeze(-1).to(per_pos.dtype)

    def mean_over_queries(self, per_query: Float[Tensor, "batch head query"]) -> Float[Tensor, "batch head"]:
        """Mean over each sequence's real query rows (pad rows excluded), in float32."""
        per_query = at_least_float32(per_query)
        mask = self.valid.to(per_query.device).unsqueeze(1).to(per_query.dtype)
        return (per_query * mask).sum(dim=2) / self.lengths.to(per_query.device).unsqueeze(-1).to(per_query.dtype)

    def at_last_token(self, per_pos: Float[Tensor, "batch pos head"]) -> Float[Tensor, "batch head"]:
        """The value at each sequence's last real position."""
        rows = torch.arange(per_pos.shape[0], device=per_pos.device)
        return at_least_float32(per_pos[rows, self.last_index.to(per_pos.device)])

    def memo(self, key: str, compute: Callable[[], Tensor]) -> Tensor:
        """Share one intermediate between score functions of the same layer and batch."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` cast to float32 if it is a narrower float (bf16, fp16); float32 and float64 unchanged
    (so a float32 model computes exactly as before)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


# Tensors derived from a weight, computed once per weight:
# (id(weight), what) -> (weakref to it, its version, layout of the view, derived tensor).
_DERIVED: dict[tuple[int, str], tuple] = {}


def derived_from_weight(weight: Tensor, what: str, make: Callable[[Tensor], Tensor]) -> Tensor:
    """``make(weight)`` (``what`` names it), cached on the weight tensor that ``weight`` is (or is
    a view of) and computed again when that weight changes in place (its version counter), moves
    to other storage, or is freed. A weight whose version cannot be read (an inference-mode
    temporary) is never cached. ``make`` runs outside inference mode, without gradients."""
    base = weight if weight._base is None else weight._base
    try:
        version = base._version
    except RuntimeError:  # inference tensors carry no version counter
        version = None
    layout = (weight.data_ptr(), weight.storage_offset(), tuple(weight.shape), tuple(weight.stride()),
              weight.dtype, weight.device)
    key = (id(base), what)
    if version is not None:
        hit = _DERIVED.get(key)
        if hit is not None and hit[0]() is base and hit[1] == version and hit[2] == layout:
            return hit[3]
    with torch.inference_mode(False), torch.no_grad():
        derived = make(weight.detach())
    if version is not None:
        for stale in [k for k, v in _DERIVED.items() if v[0]() is None]:
            del _DERIVED[stale]
        _DERIVED[key] = (weakref.ref(base), version, layout, derived)
    return derived


def keeps_transposes(weight: Tensor) -> bool:
    """Whether :func:`transposed_weight` serves ``weight``'s callers: on CPU (where TransformerLens's
    per-call copy costs more than the product it feeds) and with gradients off (a kept copy is
    detached). Elsewhere TransformerLens's own forward runs."""
    return weight.device.type == "cpu" and not torch.is_grad_enabled()


def transposed_weight(weight: Tensor) -> Tensor:
    """``weight.T.contiguous()``, made once per weight (:func:`derived_from_weight`): the layout
    TransformerLens copies a weight into on every call of its gated MLP and unembedding."""
    return derived_from_weight(weight, "transposed", lambda w: w.T.contiguous())


def output_gram_factor(w_o: Float[Tensor, "head d_head d_model"]) -> Float[Tensor, "head d_head d_head"]:
    """Per head, an upper-triangular R_h with R_hᵀ R_h = G_h = W_O^(h) W_O^(h)ᵀ, in float32.

    Then ‖o W_O^(h)‖ = ‖o R_hᵀ‖: a ``[d_head, d_head]`` product per head instead of the
    ``[d_head, d_model]`` one. R_h comes from a float64 QR of W_O^(h)ᵀ (= Q_h R_h), which is the
    Cholesky factor of G_h without forming G_h, so a nearly rank-deficient W_O loses no accuracy
    (the quadratic form o G oᵀ in float32 would). Computed once per weight
    (:func:`derived_from_weight`).
    """
    return derived_from_weight(
        w_o, "gram_factor", lambda w: torch.linalg.qr(w.double().transpose(-1, -2), mode="r").R.float())
